#!/usr/bin/env bash
# Issue 47 item 3 on a GPU machine: ranks inside one worker, measured. Needs only the
# repository's Python side and torch (no Go): carry nothing else.
#   scripts/ranks-gpu.sh OUTDIR
# 1. tests/test_ranks.py on the GPUs (CUDATest: NCCL ranks against one GPU at twice the
#    batch, FSDP2 against DDP with two GPUs or more; the CPU tests too);
# 2. speed: lm small in bf16 on 1 GPU and, with N >= 2 GPUs, on N (DDP), samples/s;
# 3. memory per GPU (torch.cuda.max_memory_allocated) for small, base and large in bf16
#    with activation checkpointing, with and without FSDP (FSDP needs two GPUs or more),
#    and without checkpointing for comparison.
# Every table goes to OUTDIR/*.md and is printed at the end. On a one-GPU machine the rows
# that need two GPUs say so (NCCL refuses two ranks on one GPU, so there is no N-GPU figure).
# Environment: PYTHON (python3), STEPS (5 timed steps a row), PRESETS ("small base large"),
# LIMIT (seconds for each step of the script, 240).
set -u
out=$1
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3} steps=${STEPS:-5} presets=${PRESETS:-small base large} limit=${LIMIT:-240}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root/pyruntime/python" || exit 2
export PYTHONPATH=$PWD
info=$("$py" -c 'import torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(n, "torch", torch.__version__, "cuda", torch.version.cuda, *(torch.cuda.get_device_name(i).replace(" ", "_") for i in range(n)))') || exit 2
n=${info%% *}
echo "GPUs: $info" | tee "$out/machine.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>"$out/machine.txt" 2>&1
[ "$n" -ge 1 ] || { echo "ranks-gpu: torch sees no GPU" >&2; exit 2; }
devs=$(seq -s, 0 $((n - 1)) | sed 's/\([0-9]\+\)/cuda:\1/g')

echo "== rank tests"
timeout "$limit" "$py" -m unittest -v tests.test_ranks >"$out/tests.txt" 2>&1
echo "exit $?" >>"$out/tests.txt"
grep -E '^(test_|Ran |OK|FAILED)|max abs difference|^exit' "$out/tests.txt"

table() { # NAME PRESET OPTIONS...
  local name=$1 preset=$2
  shift 2
  local args=()
  for o in "$@"; do args+=(--option "$o"); done
  echo "== $name"
  timeout "$limit" "$py" -m p2ptrain.tools.memory_table --preset "$preset" --devices "$devs" --steps "$steps" \
    --config '{"eval_bytes": 8192}' "${args[@]}" >"$out/$name.md" 2>"$out/$name.err"
  echo "exit $?" >>"$out/$name.err"
  cat "$out/$name.md"
}

speed=(bf16)
[ "$n" -ge 2 ] && speed+=("bf16+ddp$n")
table speed-small small "${speed[@]}"
for preset in $presets; do
  opts=(bf16+ac bf16)
  [ "$n" -ge 2 ] && opts+=("bf16+ac+fsdp$n" "bf16+ac+ddp$n")
  table "memory-$preset" "$preset" "${opts[@]}"
done
[ "$n" -ge 2 ] || echo "one GPU: no DDP/FSDP rows (two ranks cannot share a GPU under NCCL)" | tee -a "$out/machine.txt"
