#!/usr/bin/env bash
# Honest false rejections: run a clean `p2pnode demo` (one validator, honest trainers only,
# no attacker) and report how many of the honest updates the validator rejected, by reason,
# and how often honest peers were quarantined.
#
#   scripts/false-rejections.sh [-b BIN] [-w digits|charlm|lm] [-r ROUNDS] [-t TRAINERS]
#                               [-p PRESET] [-s SECONDS] [-d DIR] [-a]
#
#   -b  the p2pnode binary (default bin/p2pnode; static, so it can be copied to another machine)
#   -w  workload (default digits); -p the lm preset (default tiny)
#   -r  rounds (default 300); -t trainers (default 3)
#   -s  stop the demo after SECONDS (default: none) and report the rounds completed so far
#   -d  the demo's directory (default .p2pnode/false-rejections-WORKLOAD)
#   -a  analyse an earlier run in -d only, without running the demo
#
# The workload runs on workload.device "auto" (CUDA when torch sees a GPU). Nothing is
# guessed; the figures come from two records the validator keeps:
#   - DIR/validator/history.jsonl: one line per canonical head with the head's merged
#     contributions and the rejections its round notes (chain.Notes.Rejected, signed by the
#     proposer) count over every attempt of the round;
#   - DIR/validator.log: one "contribution rejected" line per rejected peer and round, with
#     the reason and the cosines/bar (round/merge.go rejectionDetail), and the "peer
#     quarantined" lines.
# Updates offered = merged + rejected (notes); the rates are screening's rejections (with
# the repeats below) and all rejections (late ones too) over that. The
# log's rejections are counted for the rounds that have a head; the notes' count minus them
# is reported apart, reason unknown: a peer is logged once per round, so a trainer rejected
# again in a later attempt of the round (after every update of an attempt was rejected and
# the trainers were readmitted) is not logged again, and the log's rate limit holds back
# lines beyond 30 a minute ("contribution rejections not logged").
set -euo pipefail

bin=bin/p2pnode workload=digits rounds=300 trainers=3 preset="" seconds=0 dir="" analyse_only=0
while getopts "b:w:r:t:p:s:d:a" opt; do
	case $opt in
	b) bin=$OPTARG ;;
	w) workload=$OPTARG ;;
	r) rounds=$OPTARG ;;
	t) trainers=$OPTARG ;;
	p) preset=$OPTARG ;;
	s) seconds=$OPTARG ;;
	d) dir=$OPTARG ;;
	a) analyse_only=1 ;;
	*) sed -n '2,15p' "$0" >&2; exit 2 ;;
	esac
done
dir=${dir:-.p2pnode/false-rejections-$workload}

if [ "$analyse_only" = 0 ]; then
	args=(demo --dir "$dir" --workload "$workload" --rounds "$rounds" --trainers "$trainers")
	[ -n "$preset" ] && args+=(--preset "$preset")
	echo "false-rejections: $bin ${args[*]} (time limit: ${seconds} s, 0 for none)" >&2
	mkdir -p "$(dirname "$dir")" # the demo makes $dir; its output file sits beside it
	start=$(date +%s)
	rc=0
	if [ "$seconds" -gt 0 ]; then
		timeout --signal=INT --kill-after=30 "$seconds" "$bin" "${args[@]}" >"$dir.out" 2>&1 || rc=$?
	else
		"$bin" "${args[@]}" >"$dir.out" 2>&1 || rc=$?
	fi
	echo "false-rejections: demo exited $rc after $(($(date +%s) - start)) s (output in $dir.out)" >&2
	tail -n 2 "$dir.out" >&2 || true
fi

python3 - "$dir" "$workload${preset:+/$preset}" <<'EOF'
import json, os, re, sys
from collections import Counter, defaultdict

d, workload = sys.argv[1], sys.argv[2]
hist = os.path.join(d, "validator", "history.jsonl")
logp = os.path.join(d, "validator.log")
heads = {}  # round -> point, genesis (round 0) left out
if not os.path.exists(hist):
    sys.exit(f"false-rejections: no {hist}: the validator recorded no head (see {d}.out and {logp})")
with open(hist) as f:
    for line in f:
        try:
            p = json.loads(line)
        except ValueError:
            continue  # a torn last line
        if p["round"] > 0:
            heads[p["round"]] = p  # one canonical head per round; the last line wins
if not heads:
    sys.exit(f"false-rejections: no heads in {hist}")
last = max(heads)
merged = sum(p.get("merged", 0) for p in heads.values())
noted = sum(p.get("rejected", 0) for p in heads.values())

kv = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
def fields(line):
    return {k: v.strip('"') for k, v in kv.findall(line)}

SCREEN = {"non_finite", "norm_bound", "norm_outlier", "low_cosine"}
by_reason, by_phase = Counter(), defaultdict(Counter)
quarantines, q_why, unlogged, later, readmits = 0, Counter(), 0, 0, 0
cos_rows = []
margins = defaultdict(lambda: defaultdict(list))
buckets = 10
bucket = max(1, -(-last // buckets))
with open(logp, errors="replace") as f:
    for line in f:
        if 'msg="contribution rejected"' in line:
            m = fields(line)
            r = int(m.get("round", -1))
            if r > last:
                later += 1  # a round without a head yet (the run was stopped)
                continue
            by_reason[m["reason"]] += 1
            lo = (r - 1) // bucket * bucket + 1
            by_phase[(lo, min(lo + bucket - 1, last))][m["reason"]] += 1
            if m["reason"] in ("low_cosine", "norm_outlier") and len(cos_rows) < 12:
                cos_rows.append(f"  round {r} {m['reason']}: {m.get('detail', '')}")
        elif 'msg="peer quarantined' in line:
            quarantines += 1
            # Rejections quarantine without a reason field; missed leases name theirs.
            q_why[fields(line).get("reason", "rejections")] += 1
        elif 'msg="proposed head"' in line and "screened=" in line:
            # The accepted updates' lowest cosines and the bar (validators that log them).
            m = fields(line)
            r = int(m.get("round", -1))
            if 0 < r <= last:
                lo = (r - 1) // bucket * bucket + 1
                for key, val in re.findall(r"(cosine min|to momentum min|bar) (-?[\d.]+)", m["screened"]):
                    margins[(lo, min(lo + bucket - 1, last))][key].append(float(val))
        elif 'msg="every live trainer failed this round' in line:
            readmits += 1
        elif 'msg="contribution rejections not logged' in line:
            unlogged += int(fields(line).get("count", 0))

logged = sum(by_reason.values())
offered = merged + noted
screened = sum(n for r, n in by_reason.items() if r in SCREEN)
# A peer is logged once per round: when every update of an attempt was rejected, the round
# readmits the trainers and one rejected again in a later attempt is counted by the notes
# but not logged again. Those are reported apart, reason unknown (not guessed).
repeats = noted - logged - unlogged
pct = lambda n: 100.0 * n / offered if offered else 0.0
print(f"workload {workload}: {len(heads)} heads (rounds 1-{last}), "
      f"honest updates offered {offered} = merged {merged} + rejected {noted} (round notes)")
print("rejected by reason (validator log, once per peer and round): " +
      (", ".join(f"{r} {n}" for r, n in sorted(by_reason.items())) or "none"))
if repeats > 0:
    print(f"rejected again in a later attempt of the same round (not logged again): {repeats}")
if unlogged:
    print(f"rejections held back by the log's rate limit: {unlogged}")
if repeats < 0:
    print(f"WARNING: the log names {logged} rejections, more than the notes count ({noted})")
# Screening's rate counts the repeats too (a round readmits its trainers only after every
# update of an attempt was rejected, in practice by screening): an upper bound.
scr = screened + max(repeats, 0)
print(f"screening rejections {scr} of {offered}: {pct(scr):.2f} %; all rejections {noted} (late etc. included): "
      f"{pct(noted):.2f} %; rounds where every trainer failed an attempt (readmitted) {readmits}; quarantines of honest peers {quarantines}"
      + (" (" + ", ".join(f"after {r} {n}" for r, n in sorted(q_why.items())) + ")" if q_why else ""))
if later:
    print(f"(and {later} rejections in the unfinished round after {last}, not counted)")
print("rejections by round (phase):")
for lo in range(1, last + 1, bucket):
    hi = min(lo + bucket - 1, last)
    c = by_phase.get((lo, hi), Counter())
    if True:
        got = sum(p.get("merged", 0) + p.get("rejected", 0) for r, p in heads.items() if lo <= r <= hi)
        mg = margins.get((lo, hi))
        seen = ""
        if mg:
            q = lambda xs: f"{min(xs):.3f}/{sorted(xs)[len(xs) // 2]:.3f}"
            seen = "; accepted " + ", ".join(f"{k} {q(v)}" for k, v in mg.items() if v) + " (lowest/median)"
        print(f"  rounds {lo}-{hi}: " + (", ".join(f"{r} {n}" for r, n in sorted(c.items())) or "none") +
              f" of {got} offered{seen}")
if cos_rows:
    print("first screening rejections (norm, cosine to the others, to the momentum, bar):")
    print("\n".join(cos_rows))
print(f"TABLE | {workload} | {last} | {offered} | "
      + (", ".join([f"{r} {n}" for r, n in sorted(by_reason.items())] + ([f"again in a later attempt {repeats}"] if repeats > 0 else [])) or "none")
      + f" | {pct(scr):.2f} % | {pct(noted):.2f} % | {readmits} | {quarantines}"
      + (" (" + ", ".join(f"{r} {n}" for r, n in sorted(q_why.items())) + ")" if q_why else "") + " |")
EOF
