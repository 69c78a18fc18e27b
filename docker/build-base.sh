#!/usr/bin/env bash
# Build the p2pnode base image without a registry: debootstrap a minimal Debian bookworm
# with Python, PyTorch, NumPy, scikit-learn and OpenBLAS from the Debian mirror apt already
# uses, and `docker import` it as p2pnode-base:<hash>, <hash> being a hash of the package
# list (and of what else shapes the root file system). When that tag exists, nothing is done.
#
# Prints the image tag on stdout (last line); progress goes to stderr.
#
# Environment:
#   DEBIAN_MIRROR   mirror to debootstrap from (default: the first Debian URI in apt's sources)
#   BASE_CACHE      where the downloaded .debs are kept between builds
#                   (default: ~/.cache/p2pnode/debootstrap)
#   FORCE=1         rebuild even when the tag exists
set -euo pipefail

SUITE=bookworm
VARIANT=minbase
PACKAGES=(python3 python3-torch python3-numpy python3-sklearn libopenblas0-pthread ca-certificates)
# Bump when the clean-up below changes what ends up in the image.
RECIPE=2

log() { echo "build-base: $*" >&2; }

key="$(printf '%s\n' "$SUITE" "$VARIANT" "$RECIPE" "${PACKAGES[@]}" | sha256sum | cut -c1-12)"
tag="p2pnode-base:$key"

if [[ "${FORCE:-0}" != 1 ]] && docker image inspect "$tag" >/dev/null 2>&1; then
	log "$tag exists (cached)"
	echo "$tag"
	exit 0
fi

if [[ $(id -u) != 0 ]]; then
	log "debootstrap needs root: run as root (or with sudo)"
	exit 1
fi
if ! command -v debootstrap >/dev/null; then
	log "installing debootstrap (Debian package)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; } ||
		{ log "could not install debootstrap (apt-get install debootstrap)"; exit 1; }
fi

mirror_from_apt() {
	local u
	# deb822 sources first, then one-line sources; skip security and non-Debian entries.
	u=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | grep -m1 debian || true)
	if [[ -z "$u" ]]; then
		u=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}' | grep -v security | grep -m1 debian || true)
	fi
	echo "${u:-http://deb.debian.org/debian}"
}
mirror="${DEBIAN_MIRROR:-$(mirror_from_apt)}"

cache="${BASE_CACHE:-$HOME/.cache/p2pnode/debootstrap}"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"

# One build at a time on this machine: a second caller waits, then finds the tag.
exec 9>"$cache/.lock"
flock 9
if [[ "${FORCE:-0}" != 1 ]] && docker image inspect "$tag" >/dev/null 2>&1; then
	log "$tag exists (built while we waited)"
	echo "$tag"
	exit 0
fi

root="$(mktemp -d "${TMPDIR:-/tmp}/p2pnode-base.XXXXXX")"
trap 'rm -rf "$root"' EXIT
start=$(date +%s)
log "debootstrap $VARIANT $SUITE from $mirror with ${PACKAGES[*]}"
include=$(IFS=,; echo "${PACKAGES[*]}")
debootstrap --variant="$VARIANT" --include="$include" --cache-dir="$cache" \
	"$SUITE" "$root" "$mirror" >&2

# What a container never needs: apt's lists and package cache, documentation, man pages,
# translations. apt still works after `apt-get update`.
#
# Debian's libtorch1.13 and python3-scipy pull in build-time packages (boost and OpenBLAS
# headers, gcc for pythran, torch's C++ test binaries) and mesa's GL drivers through
# OpenCV: about 600 MB that nothing loads at run time (libtorch links libGL, which only
# dlopens the drivers on a GL context). Their files go; dpkg still lists the packages.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
	"$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
	"$root"/var/log/* "$root"/tmp/* "$root"/dev/*
rm -rf "$root"/usr/include/* "$root"/usr/lib/gcc "$root"/usr/lib/libtorch-test \
	"$root"/usr/lib/x86_64-linux-gnu/dri "$root"/usr/lib/x86_64-linux-gnu/libLLVM-*.so*
find "$root"/usr/lib -name '*.a' -delete
find "$root"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'C.*' ! -name locale.alias -exec rm -rf {} + 2>/dev/null || true

log "importing into docker as $tag"
tar --numeric-owner -C "$root" -c . | docker import \
	--change 'ENV LANG=C.UTF-8' \
	--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'CMD ["/bin/bash"]' \
	--message "p2pnode base: debootstrap $VARIANT $SUITE + ${PACKAGES[*]}" \
	- "$tag" >&2
log "built $tag in $(( $(date +%s) - start ))s ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
echo "$tag"
