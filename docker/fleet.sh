#!/usr/bin/env bash
# Run a p2pnode fleet with docker-compose: one validator (also the bootstrap node) and
# three trainers (eight with FLEET_OVERLAYS=scale), from e2e/compose.yaml.
#
#   docker/fleet.sh up       write the configs (first time), prepare the dataset, start
#   docker/fleet.sh status   one line per node: round, head, held-out accuracy
#   docker/fleet.sh logs     follow the validator's progress
#   docker/fleet.sh down     stop and remove the containers (the stores are kept)
#   docker/fleet.sh purge    ... and the volumes (stores, dataset)
#   docker/fleet.sh config   (re)write the configs; the validator's identity is kept
#
# Environment:
#   FLEET_DIR       configs (default .p2pnode/fleet), mounted read-only at /config
#   FLEET_PROJECT   compose project name (default p2pnode-fleet)
#   FLEET_OVERLAYS  space-separated overlays: scale, poison, public (poison needs an image
#                   of the attack build, `make image TAGS=attack`: its trainer runs --poison)
#   FLEET_ROUNDS    experiment.rounds when writing configs (default 0: train until stopped)
#   P2PNODE_IMAGE   image (default p2pnode:latest, built by `make image`)
#
# Needs Docker and the image only: the configs are written by `p2pnode fleet-config`, run
# from the image.
set -euo pipefail
cd "$(dirname "$0")/.."
image="${P2PNODE_IMAGE:-p2pnode:latest}"

FLEET_DIR="${FLEET_DIR:-.p2pnode/fleet}"
mkdir -p "$FLEET_DIR"
export P2PNODE_FLEET="$(cd "$FLEET_DIR" && pwd)"
project="${FLEET_PROJECT:-p2pnode-fleet}"

if docker compose version >/dev/null 2>&1; then
	compose=(docker compose)
elif docker-compose version >/dev/null 2>&1; then
	compose=(docker-compose)
else
	echo "fleet: neither \`docker compose\` nor \`docker-compose\` answers" >&2
	exit 1
fi
files=(-f e2e/compose.yaml)
for o in ${FLEET_OVERLAYS:-}; do files+=(-f "e2e/compose.$o.yaml"); done
dc() { "${compose[@]}" -p "$project" "${files[@]}" "$@"; }

need_image() {
	docker image inspect "$image" >/dev/null 2>&1 || { echo "fleet: no image $image: run make image" >&2; exit 1; }
}

# As root in the container, so that validator.key is handed to the image's user.
write_config() {
	need_image
	docker run --rm --network none --user 0 -v "$P2PNODE_FLEET:/fleet" "$image" \
		fleet-config --dir /fleet --rounds "${FLEET_ROUNDS:-0}"
}

status() {
	for svc in $(dc ps --services 2>/dev/null | sort); do
		id="$(dc ps -q "$svc" 2>/dev/null | head -n1)"
		[[ -n "$id" && "$svc" != dataset ]] || continue
		line="$(docker exec "$id" p2pnode status --addr 127.0.0.1:8080 2>/dev/null |
			awk '/^head /{r=$4; sub(/,/, "", r); h="round " r "  head " $2} /^held-out +accuracy/{a="  accuracy " $3} /^connected/{c="  peers " $2} END{print h a c}')" || true
		printf '%-12s %s\n' "$svc" "${line:-not answering ($(docker inspect -f '{{.State.Status}}' "$id"))}"
	done
}

case "${1:-}" in
config) write_config ;;
up)
	need_image
	[[ -f "$P2PNODE_FLEET/validator.yaml" ]] || write_config
	dc up -d
	echo "fleet: up. Watch it with: docker/fleet.sh status (or logs)"
	;;
status) status ;;
logs) dc logs -f --tail 20 validator ;;
down) dc down --remove-orphans ;;
purge) dc down -v --remove-orphans ;;
*)
	sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
	;;
esac
