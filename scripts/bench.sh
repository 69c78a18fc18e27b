#!/usr/bin/env bash
# Runs the project's benchmarks and prints one table of ratios, each against a baseline
# measured in the same run (medians over BENCH_COUNT repetitions). Raw output is kept in
# bench-out.txt. Set BENCH_FILTER to a regexp of benchmark names to run a subset.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
COUNT=${BENCH_COUNT:-3}
FILTER=${BENCH_FILTER:-.}
out=bench-out.txt
: > "$out"
run() { # package benchmark-regexp benchtime
  if [[ "$2" =~ $FILTER ]] || [[ "$FILTER" == "." ]]; then
    echo "bench: $1 $2" >&2
    go test -run '^$' -bench "$2" -benchtime "$3" -count "$COUNT" -timeout 60m "$1" | tee -a "$out" >&2
  fi
}
run ./merge/ 'Merge8x25M$' 5x
run ./pyruntime/ 'PackRoundTrip$' 1x
run ./pyruntime/ 'WorkerTrain$' 1x
run ./artifact/ 'ArtifactFetch' 3x
run ./artifact/ 'SwarmFetch' 1x
run ./gossip/ 'Gossip' 1x
if ls export/*_test.go >/dev/null 2>&1 && grep -qh '^func Benchmark' export/*_test.go; then
  run ./export/ '.' 1x
fi
echo
go run ./internal/benchtable < "$out"
