#!/usr/bin/env bash
# Issue 15 item 6 on a GPU machine: TestLMLearningCheck (e2e/lmcheck_test.go) for several
# seeds and outer settings side by side, one GPU shared. Needs bin/p2pnode (the attack build,
# as the e2e harness runs it) and bin/e2e.test, built where Go is (stripped: 48 MiB together,
# under the device's 64 MiB working tree, where unstripped they are 67 MiB):
#   make build TAGS=attack LDFLAGS='-s -w' && go test -c -ldflags='-s -w' -o bin/e2e.test ./e2e/
# Usage: scripts/lmcheck-gpu.sh OUTDIR ROUNDS H SECONDS "seed:lr,momentum,nesterov" ...
# Environment: PRESET (small), PRECISION (bf16), EVAL_BYTES (65536), PYTHON (python3).
# Each run's table goes to OUTDIR/<seed>-<outer>.txt, its progress to the .log beside it.
# DATA_PARALLEL=KEYS (e.g. batch_size=48,lr=0.003 for small: the three trainers' batches as
# one, the preset's lr times three) also runs the data-parallel yardstick beside them, the
# plain-PyTorch reference as one worker with outer lr 1 and no momentum taking H steps of that
# batch a round, the first run's seed, to OUTDIR/data-parallel.txt (docs/diloco-cost.md).
set -u
out=$1 rounds=$2 h=$3 secs=$4
shift 4
root=$(cd "$(dirname "$0")/.." && pwd)
for b in p2pnode e2e.test; do
  [ -x "$root/bin/$b" ] || { echo "lmcheck-gpu: $root/bin/$b is missing (see the header)" >&2; exit 2; }
done
py=${PYTHON:-python3} preset=${PRESET:-small} precision=${PRECISION:-bf16} eval_bytes=${EVAL_BYTES:-65536}
info=$("$py" -c 'import torch, numpy; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")') || exit 2
echo "$info"
case $info in *" cuda True "*) dev=cuda ;; *) dev=cpu ;; esac
mkdir -p "$out"
(while sleep 20; do nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader; done) >"$out/gpu.txt" 2>&1 &
mon=$!
pids=()
for run in "$@"; do
  seed=${run%%:*} outer=${run#*:}
  name="seed$seed-${outer//,/_}"
  P2PNODE_E2E_BINARY="$root/bin/p2pnode" P2PNODE_LM_CHECK=1 P2PNODE_LM_CHECK_PRESET=$preset P2PNODE_LM_CHECK_PYTHON=$py \
    P2PNODE_LM_CHECK_ROUNDS=$rounds P2PNODE_LM_CHECK_H=$h P2PNODE_LM_CHECK_SEED=$seed \
    P2PNODE_LM_CHECK_OUTER=$outer P2PNODE_LM_CHECK_DECAY=fit \
    P2PNODE_LM_CHECK_PRECISION=$precision P2PNODE_LM_CHECK_EVAL_BYTES=$eval_bytes \
    P2PNODE_LM_CHECK_OUT="$out/$name.txt" \
    "$root/bin/e2e.test" -test.run '^TestLMLearningCheck$' -test.v -test.count=1 -test.timeout "${secs}s" \
    >"$out/$name.log" 2>&1 &
  pids+=($!)
done
if [ -n "${DATA_PARALLEL:-}" ]; then
  prec=()
  [ "$precision" = bf16 ] && prec=(--bf16)
  (cd "$root/pyruntime/python" && exec timeout "$secs" "$py" -m p2ptrain.tools.diloco_lm_reference \
    --preset "$preset" --device "$dev" ${prec[@]+"${prec[@]}"} --config "eval_bytes=$eval_bytes" \
    --seeds "${1%%:*}" --rounds "$rounds" --h "$h" --workers 1 --swarm-config "$DATA_PARALLEL" \
    --outer 1.0:0:plain) >"$out/data-parallel.txt" 2>&1 &
  pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done
kill $mon 2>/dev/null
echo "GPU utilization, memory every 20 s:"; tr "\n" " " <"$out/gpu.txt"; echo
for f in "$out"/*.log; do
  echo "== $f"
  t=${f%.log}.txt
  if [ -s "$t" ]; then sed '/^swarm:/,$d' "$t"; else grep -E 'lmcheck_test.go:[0-9]+: [0-9]+s \||^--- ' "$f"; fi
done
if [ -n "${DATA_PARALLEL:-}" ]; then
  # The reference's "DiLoCo" column is the one worker's, i.e. data parallelism; its "one node"
  # runs H steps of the preset's batch a round and is not the comparison.
  echo "== $out/data-parallel.txt (the DiLoCo column is data parallelism, $DATA_PARALLEL)"
  grep -E '^(lm |\| round |\| outer|\|---|\| [0-9]+ \|)' "$out/data-parallel.txt" || tail -n 5 "$out/data-parallel.txt"
fi
