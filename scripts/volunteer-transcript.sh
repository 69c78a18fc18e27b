#!/usr/bin/env bash
# A volunteer's first join, end to end, in two network namespaces on this machine:
# an owner namespace runs `p2pnode init --owner` and `run` (digits), a volunteer namespace
# has nothing but the extracted release tarball, an empty HOME and a fresh directory, and
# runs `p2pnode doctor` and the `p2pnode join` line that `p2pnode invite` printed. It prints
# every command with what it printed, and the times from the start of `join` to the record
# fetched, the dataset prepared, the first lease to the volunteer and its first merged
# contribution; then `p2pnode credits` on the owner. Everything it creates (namespaces, the
# veth pair, processes) is removed on exit, also on failure or Ctrl-C.
#
#   sudo scripts/volunteer-transcript.sh [TARBALL]
#
# TARBALL defaults to the one `make release RELEASE_ARCHS=amd64` builds from this checkout
# (dist/p2pnode-VERSION-linux-amd64.tar.gz). Needs root, iproute2, tar, and Debian's torch at
# /usr/bin/python3 (the volunteer's "machine" shares this one's filesystem, so /usr is the
# same; its HOME, working directory and PATH are not).
#
# Environment: WORK (default: a new temp dir, kept so the logs can be read), WAIT_S (how long
# to wait for the volunteer's first merged contribution, default 300), JOIN_AT_ROUND (join
# only once the owner has proposed that round: a model the owner trained further), STAY_ROUNDS
# (keep the volunteer that many rounds after its first merged contribution, then report the
# honest rejections over them: issue 42's "no honest volunteer turned away"; default 0, Ctrl-C
# three seconds after it), NET (the /30 the two namespaces share, default 198.18.43.0:
# 198.18.0.0/15 is for benchmarking labs).
set -euo pipefail

cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "volunteer-transcript: needs root (network namespaces)" >&2; exit 1; }
for tool in ip tar sha256sum pgrep; do
	command -v "$tool" >/dev/null || { echo "volunteer-transcript: $tool not found" >&2; exit 1; }
done
[[ -x /usr/bin/python3 ]] || { echo "volunteer-transcript: /usr/bin/python3 not found (apt-get install python3-torch python3-numpy python3-sklearn)" >&2; exit 1; }

tarball=${1:-}
if [[ -z $tarball ]]; then
	make release RELEASE_ARCHS=amd64 >&2
	tarball=$(ls dist/p2pnode-*-linux-amd64.tar.gz | head -1)
fi
[[ -f $tarball ]] || { echo "volunteer-transcript: no tarball at $tarball" >&2; exit 1; }
tarball=$(cd "$(dirname "$tarball")" && pwd)/$(basename "$tarball")

WAIT_S=${WAIT_S:-300}
JOIN_AT_ROUND=${JOIN_AT_ROUND:-0}
STAY_ROUNDS=${STAY_ROUNDS:-0}
NET=${NET:-198.18.43.0}
base=${NET%.*}; last=${NET##*.}
own_ip=$base.$((last + 1)); vol_ip=$base.$((last + 2))
case $own_ip in 198.18.*|198.19.*) ;; *) echo "volunteer-transcript: NET must be in 198.18.0.0/15" >&2; exit 1 ;; esac

WORK=${WORK:-$(mktemp -d /tmp/volunteer-transcript.XXXXXX)}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
own_ns=p2pvol-$$-owner vol_ns=p2pvol-$$-vol
own_if=pv$$o vol_if=pv$$v
owner_pid= vol_pid=
out=$WORK/transcript.txt
: >"$out"

stop() { # stop a process group we started: SIGINT (as Ctrl-C), then SIGKILL after 10 s
	local pid=$1
	[[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
	kill -INT -- "-$pid" 2>/dev/null || true
	for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
	kill -KILL -- "-$pid" 2>/dev/null || true
}
cleanup() {
	stop "$vol_pid"; stop "$owner_pid"
	ip netns del "$own_ns" 2>/dev/null || true
	ip netns del "$vol_ns" 2>/dev/null || true
	ip link del "$own_if" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '%s\n' "$*" | tee -a "$out"; }
now_us() { echo "${EPOCHREALTIME/./}"; }
since() { # seconds from $1 (µs) to $2 (µs, default now), two decimals
	local d=$(( ${2:-$(now_us)} - $1 ))
	printf '%d.%02d' $((d / 1000000)) $((d % 1000000 / 10000))
}
# stamp prefixes each line with the seconds since $1 (µs), as it arrives.
# A line is kept as a terminal shows it: what follows its last carriage return (the status
# line a progress meter redraws is erased that way before other output).
stamp() {
	local t0=$1 l
	while IFS= read -r l; do
		l=${l%$'\r'}; l=${l##*$'\r'}; l=${l//$'\033[K'/}
		[[ -n $l ]] || continue
		printf '%7ss  %s\n' "$(since "$t0")" "$l"
	done
}
# descendant PID NAME: the first process named NAME under PID.
descendant() {
	local kids k found
	kids=$(pgrep -P "$1" || true)
	for k in $kids; do
		[[ $(cat "/proc/$k/comm" 2>/dev/null) == "$2" ]] && { echo "$k"; return; }
		found=$(descendant "$k" "$2"); [[ -n $found ]] && { echo "$found"; return; }
	done
}
# run_in NS DIR CMD...: the command as a bare machine runs it: empty environment but HOME,
# PATH and TERM, in DIR.
run_in() {
	local ns=$1 dir=$2 home=$3; shift 3
	ip netns exec "$ns" env -i HOME="$home" PATH=/usr/local/bin:/usr/bin:/bin TERM=xterm \
		bash -c 'cd "$1" && shift && exec "$@"' _ "$dir" "$@"
}
# honest_rejections ROUND: from the owner's JSON log, the updates offered in the owner's
# proposed heads from ROUND on (merged + rejected, the last head of each round), the
# rejections by reason and peer (the owner and the volunteer are both honest), and the
# quarantines. A round without a proposed head yet (the one open at Ctrl-C) is left out.
honest_rejections() {
	python3 - "$WORK/owner/run.log" "$1" <<'PY'
import json, sys
from collections import Counter
path, first = sys.argv[1], int(sys.argv[2])
heads, rej, quar = {}, [], []
with open(path, errors="replace") as f:
    for line in f:
        try:
            m = json.loads(line)
        except ValueError:
            continue
        r = m.get("round")
        if m.get("msg") == "proposed head" and r is not None and r >= first:
            heads[r] = m
        elif m.get("msg") == "contribution rejected" and r is not None and r >= first:
            rej.append(m)
        elif str(m.get("msg", "")).startswith("peer quarantined"):
            quar.append(m)
if not heads:
    sys.exit("volunteer-transcript: no proposed head from round %d on" % first)
last = max(heads)
rej = [m for m in rej if m["round"] <= last]
merged = sum(h.get("merged", 0) for h in heads.values())
offered = merged + len(rej)
pct = 100.0 * len(rej) / offered if offered else 0.0
print(f"rounds {first}-{last}: {len(heads)} heads, honest updates offered {offered} = merged {merged} + rejected {len(rej)} ({pct:.2f} %)")
by = Counter((m.get("reason"), m.get("peer", "")[-6:]) for m in rej)
for (reason, peer), n in sorted(by.items()):
    print(f"  {reason} x{n} (peer ...{peer})")
for m in rej:
    print(f"  round {m['round']} {m.get('reason')}: {str(m.get('detail', ''))[:160]}")
print(f"honest quarantines: {len(quar)}")
PY
}
# trim keeps transcripts readable: a long line is cut at 220 characters.
trim() { cut -c1-220; }

say "# volunteer transcript, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) CPU cores, $(uname -m)"
say "# tarball $(basename "$tarball")  sha256 $(sha256sum "$tarball" | cut -c1-16)…"

# Two namespaces joined by one veth pair: the volunteer reaches the owner at $own_ip and
# nothing else (no route out, no DNS).
ip netns add "$own_ns"; ip netns add "$vol_ns"
ip link add "$own_if" type veth peer name "$vol_if"
ip link set "$own_if" netns "$own_ns"; ip link set "$vol_if" netns "$vol_ns"
ip -n "$own_ns" addr add "$own_ip/30" dev "$own_if"; ip -n "$vol_ns" addr add "$vol_ip/30" dev "$vol_if"
for ns in "$own_ns" "$vol_ns"; do ip -n "$ns" link set lo up; done
ip -n "$own_ns" link set "$own_if" up; ip -n "$vol_ns" link set "$vol_if" up
say "# owner namespace $own_ns ($own_ip), volunteer namespace $vol_ns ($vol_ip)"

# The owner: the same release binary, its own empty HOME.
mkdir -p "$WORK/owner/home" "$WORK/owner/bin"
tar -C "$WORK/owner/bin" --strip-components=1 -xzf "$tarball"
obin=$WORK/owner/bin/p2pnode
say ""
say "## owner"
say "\$ p2pnode init --owner --dir exp"
run_in "$own_ns" "$WORK/owner" "$WORK/owner/home" "$obin" init --owner --dir exp 2>&1 | tee -a "$out"
ocfg=$WORK/owner/exp/p2pnode.yaml
# Train until stopped, so the volunteer joins a live experiment however slow this machine.
sed -i 's/^  rounds: 100$/  rounds: 0/' "$ocfg"
grep -q '^  rounds: 0$' "$ocfg" || { echo "volunteer-transcript: could not set experiment.rounds: 0 in $ocfg" >&2; exit 1; }
say "# (experiment.rounds set to 0 in exp/p2pnode.yaml: train until stopped)"
say "\$ p2pnode run --config exp/p2pnode.yaml --log-format json   # in the background, log in $WORK/owner/run.log"
ip netns exec "$own_ns" setsid env -i HOME="$WORK/owner/home" PATH=/usr/local/bin:/usr/bin:/bin \
	bash -c 'cd "$1" && exec nice -n 10 "$2" run --config exp/p2pnode.yaml --log-format json' _ "$WORK/owner" "$obin" \
	>"$WORK/owner/run.log" 2>&1 &
owner_pid=$!
for _ in $(seq 1200); do
	grep -q '"msg":"proposed head"' "$WORK/owner/run.log" 2>/dev/null && break
	kill -0 "$owner_pid" 2>/dev/null || { tail -20 "$WORK/owner/run.log" >&2; echo "volunteer-transcript: the owner exited" >&2; exit 1; }
	sleep 0.1
done
grep -q '"msg":"proposed head"' "$WORK/owner/run.log" || { tail -20 "$WORK/owner/run.log" >&2; echo "volunteer-transcript: the owner merged no round in 120 s" >&2; exit 1; }
if (( JOIN_AT_ROUND > 0 )); then
	for _ in $(seq $((WAIT_S * 10))); do
		grep -q "\"msg\":\"proposed head\",\"pkg\":\"node\",\"round\":$JOIN_AT_ROUND," "$WORK/owner/run.log" && break
		sleep 0.1
	done
	say "# (the volunteer joins once the owner has proposed round $JOIN_AT_ROUND)"
fi
say "\$ p2pnode invite --config exp/p2pnode.yaml"
invite=$(run_in "$own_ns" "$WORK/owner" "$WORK/owner/home" "$obin" invite --config exp/p2pnode.yaml 2>&1)
printf '%s\n' "$invite" | tee -a "$out"
addr=$(printf '%s\n' "$invite" | awk '$1 == "p2pnode" && $2 == "join" { print $3; exit }')
[[ -n $addr ]] || { echo "volunteer-transcript: invite printed no join line" >&2; exit 1; }

# The volunteer: a fresh directory holding only the tarball, an empty HOME.
vdir=$WORK/volunteer vhome=$WORK/volunteer-home
mkdir -p "$vdir" "$vhome"
cp "$tarball" "$vdir/"
tb=$(basename "$tarball")
say ""
say "## volunteer (fresh directory, HOME empty, only the tarball)"
say "\$ tar xzf $tb && cd ${tb%.tar.gz}"
run_in "$vol_ns" "$vdir" "$vhome" tar xzf "$tb"
vwd=$vdir/${tb%.tar.gz}
say "\$ ls"
run_in "$vol_ns" "$vwd" "$vhome" ls | tee -a "$out"
say "\$ ./p2pnode --version"
run_in "$vol_ns" "$vwd" "$vhome" ./p2pnode --version 2>&1 | tee -a "$out"
say "\$ ./p2pnode doctor"
run_in "$vol_ns" "$vwd" "$vhome" ./p2pnode doctor 2>&1 | trim | tee -a "$out" || true

# join, as in a terminal when `script` (util-linux) is there: the terminal's output is what
# a volunteer sees. Each line is prefixed with the seconds since join started.
say "\$ ./p2pnode join $addr   # each line: seconds since start"
join=(./p2pnode join "$addr")
if command -v script >/dev/null; then
	q=$(printf '%q ' "${join[@]}")
	join=(script -qfec "$q" /dev/null)
fi
t0=$(now_us)
start_wall=$(date -u '+%H:%M:%S.%3N')
bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$WORK/volunteer/join.pid" \
	ip netns exec "$vol_ns" setsid env -i HOME="$vhome" PATH=/usr/local/bin:/usr/bin:/bin TERM=xterm \
	bash -c 'cd "$1" && shift && exec nice -n 10 "$@"' _ "$vwd" "${join[@]}" \
	</dev/null 2>&1 | stamp "$t0" >"$WORK/volunteer/join.log" &
for _ in $(seq 50); do [[ -s $WORK/volunteer/join.pid ]] && break; sleep 0.1; done
vol_pid=$(cat "$WORK/volunteer/join.pid")
# The owner's JSON log says when it leased to two trainers (itself and the volunteer) and
# when a head merged two contributions; the volunteer's terminal when it saw such a head.
merged_at= first_round=
for _ in $(seq $((WAIT_S * 10))); do
	line=$(grep -m1 '"msg":"proposed head".*"merged":[2-9]' "$WORK/owner/run.log" || true)
	if [[ -n $line ]]; then
		merged_at=$(now_us)
		first_round=$(sed -E 's/.*"round":([0-9]+).*/\1/' <<<"$line")
		break
	fi
	sleep 0.1
done
if (( STAY_ROUNDS > 0 )) && [[ -n $first_round ]]; then
	# Stay until the owner has proposed the round STAY_ROUNDS after the volunteer's first
	# merged one (an hour at most), showing the round reached every 30 s.
	want=$((first_round + STAY_ROUNDS))
	for i in $(seq 36000); do
		grep -q "\"msg\":\"proposed head\",\"pkg\":\"node\",\"round\":$want," "$WORK/owner/run.log" && break
		(( i % 300 == 0 )) && echo "volunteer-transcript: staying until round $want; the owner proposed round $(grep '"msg":"proposed head"' "$WORK/owner/run.log" | tail -1 | sed -E 's/.*"round":([0-9]+).*/\1/')" >&2
		kill -0 "$vol_pid" 2>/dev/null || { echo "volunteer-transcript: the volunteer exited before round $want" >&2; break; }
		sleep 0.1
	done
	say "^C   (the script presses Ctrl-C once the owner has proposed round $want, $STAY_ROUNDS rounds after the volunteer's first merged one)"
else
	sleep 3 # a few more rounds for the transcript
	say "^C   (the script presses Ctrl-C three seconds after the owner merged a contribution of the volunteer)"
fi
# Ctrl-C reaches the node itself (under script, the pty's foreground process).
node_pid=$(descendant "$vol_pid" p2pnode)
[[ -n $node_pid ]] && kill -INT "$node_pid" 2>/dev/null || true
for _ in $(seq 100); do kill -0 "$vol_pid" 2>/dev/null || break; sleep 0.1; done
stop "$vol_pid"; vol_pid=
sleep 0.5
# Everything up to its first round line with two contributions merged and five more; then
# how many lines were left out, and the last three (Ctrl-C's).
awk '{ n++ }
	seen == 0 || n <= seen + 5 { print; if (seen == 0 && $0 ~ /round +[0-9]+ .*merged [2-9] /) seen = n; next }
	{ tail[n % 3] = $0; left++ }
	END { if (left > 3) printf "      …  (%d lines left out)\n", left - 3
		for (i = n - 2; i <= n; i++) if (i > seen + 5) print tail[i % 3] }' "$WORK/volunteer/join.log" | trim | tee -a "$out"
[[ -n $merged_at ]] || { echo "volunteer-transcript: no head merged the volunteer's contribution in ${WAIT_S} s" >&2; exit 1; }

# Times from the owner's JSON log (its "time" fields) and the volunteer's stamped lines.
epoch_us() { date -u -d "$1" '+%s%6N'; }
owner_time() { # the time of the first owner log line matching $1
	local line; line=$(grep -m1 -E "$1" "$WORK/owner/run.log" || true)
	[[ -n $line ]] || return 0
	sed -E 's/.*"time":"([^"]+)".*/\1/' <<<"$line"
}
vol_at() { grep -m1 -E "$1" "$WORK/volunteer/join.log" | awk '{ print $1 }' || true; }
lease_t=$(owner_time '"msg":"issued leases".*"trainers":[2-9]')
merge_t=$(owner_time '"msg":"proposed head".*"merged":[2-9]')
say ""
say "## times (join started $start_wall UTC)"
say "record fetched and checked   $(vol_at '^ *[0-9.]+s  doctor: this machine')   (the doctor line join prints after the record)"
say "config written               $(vol_at 'config +wrote')"
say "dataset prepared             $(vol_at 'preparing the dataset')   (its progress line, the last update)"
[[ -n $lease_t ]] && say "first lease to the volunteer $(since "$t0" "$(epoch_us "$lease_t")")s   (owner: \"issued leases\" to 2 trainers)"
[[ -n $merge_t ]] && say "first merged contribution    $(since "$t0" "$(epoch_us "$merge_t")")s   (owner: \"proposed head\" merged 2)"
say "volunteer sees it merged     $(vol_at 'round +[0-9]+ .*merged [2-9] ')   (its first round line with merged 2)"

if (( STAY_ROUNDS > 0 )) && [[ -n $first_round ]]; then
	say ""
	say "## honest rejections from round $first_round (the volunteer's first merged) on"
	honest_rejections "$first_round" | tee -a "$out"
fi

say ""
say "## owner"
say "\$ p2pnode credits --config exp/p2pnode.yaml"
run_in "$own_ns" "$WORK/owner" "$WORK/owner/home" "$obin" credits --config exp/p2pnode.yaml 2>&1 | trim | tee -a "$out"
say ""
say "## volunteer, after Ctrl-C"
say "\$ ./p2pnode credits --config p2pnode.yaml"
run_in "$vol_ns" "$vwd" "$vhome" ./p2pnode credits --config p2pnode.yaml 2>&1 | trim | tee -a "$out"
say "\$ ./p2pnode doctor --config p2pnode.yaml"
run_in "$vol_ns" "$vwd" "$vhome" ./p2pnode doctor --config p2pnode.yaml 2>&1 | trim | tee -a "$out" || true
say ""
say "# transcript in $out; logs in $WORK"
