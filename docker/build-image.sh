#!/usr/bin/env bash
# Build the p2pnode image from bin/p2pnode (run `make build` first).
#
#   docker/build-image.sh            local path, no registry: base from docker/build-base.sh
#   BASE_IMAGE=debian:bookworm-slim docker/build-image.sh
#                                    public path: apt-get installs the packages in the build
#   BASE_IMAGE=pytorch/pytorch:<tag>-cuda<ver>-cudnn<ver>-runtime INSTALL_PACKAGES=0 IMAGE=p2pnode:cuda docker/build-image.sh
#                                    a CUDA PyTorch base (docs/gpu.md; untested here)
#
# IMAGE names the result (default p2pnode:latest), BIN the binary it holds (default
# bin/p2pnode; `make e2e` builds the attack build as bin/p2pnode-attack into
# p2pnode-attack:latest, leaving the user's binary and image alone). Prints the image's size.
set -euo pipefail
cd "$(dirname "$0")/.."
image="${IMAGE:-p2pnode:latest}"
bin="${BIN:-bin/p2pnode}"

[[ -x "$bin" ]] || { echo "build-image: $bin is missing: run make build" >&2; exit 1; }
if file "$bin" 2>/dev/null | grep -q 'dynamically linked'; then
	echo "build-image: $bin is dynamically linked: build it with CGO_ENABLED=0 (make build)" >&2
	exit 1
fi

if [[ -n "${BASE_IMAGE:-}" ]]; then
	# INSTALL_PACKAGES=0 for a base that has torch already (a CUDA PyTorch image, docs/gpu.md).
	args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "INSTALL_PACKAGES=${INSTALL_PACKAGES:-1}")
else
	base="$(docker/build-base.sh | tail -n1)"
	args=(--build-arg "BASE_IMAGE=$base" --build-arg INSTALL_PACKAGES=0)
fi

# The classic builder when BuildKit's buildx plugin is absent (it is here).
docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0

# A context of just the binary and the Dockerfile: the repository (stores, datasets, .git)
# never travels to the daemon.
ctx="$(mktemp -d "${TMPDIR:-/tmp}/p2pnode-image.XXXXXX")"
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin"
cp "$bin" "$ctx/bin/p2pnode"
cp docker/Dockerfile "$ctx/Dockerfile"
old="$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
start=$(date +%s)
if ! docker build "${args[@]}" -t "$image" "$ctx" >"$ctx/build.log" 2>&1; then
	cat "$ctx/build.log" >&2
	echo "build-image: docker build failed" >&2
	exit 1
fi
# The image it replaces, unless a container still uses it.
new="$(docker image inspect -f '{{.Id}}' "$image")"
if [[ -n "$old" && "$old" != "$new" ]]; then docker rmi "$old" >/dev/null 2>&1 || true; fi
size=$(docker image inspect -f '{{.Size}}' "$image")
echo "build-image: $image built in $(( $(date +%s) - start ))s, $(awk -v s="$size" 'BEGIN{printf "%.0f MB", s/1e6}')"
