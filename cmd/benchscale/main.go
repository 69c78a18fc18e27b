// Command benchscale is `make bench-scale`: one full round of a swarm on this machine for
// each model size and trainer count asked for, every node a real p2pnode process (its own
// store on disk, libp2p over loopback TCP) running the synthetic Go workload padded to the
// model size, and one table of where the round's time went, the bytes moved and each
// role's peak RSS in model sizes.
//
// Each node is this binary re-executed as `benchscale node` (node.New with the synthetic
// workload); each call of the workload that touches the model (init, train, evaluate) runs
// in a further child, `benchscale worker`, as the Python worker runs beside a real node, so
// a node's peak RSS (VmHWM) is its Go side alone and the worker's is reported apart.
//
// Stage times come from the nodes' own logs (JSON lines, one clock): the leader's "issued
// leases", the trainers' "trained" (window, params fetch and shard fetch times), the
// worker calls, the validators' "merge stage" records (round.Merger.Observe), "proposed
// head", the followers' "attested head", the progress line of each canonical head and the
// checkpointer's "checkpoint saved". Bytes are each node's libp2p counters for the round
// (history.jsonl).
//
// Knobs (environment): BENCH_SCALE_SIZES (1M,10M,100M,1B), BENCH_SCALE_TRAINERS (3,8,16),
// BENCH_SCALE_VALIDATORS (2: a leader that signs, a follower that attests),
// BENCH_SCALE_ROUNDS (2; the table shows the last), BENCH_SCALE_DIR (a directory under
// $TMPDIR), BENCH_SCALE_TIMEOUT (30m per row), BENCH_SCALE_KEEP=1 keeps each row's stores
// and logs. Rows that need more disk or memory than this machine has free print what they
// would need instead of running.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "node":
			os.Exit(runNode(os.Args[2:]))
		case "worker":
			os.Exit(runWorker())
		}
	}
	if err := runBench(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
		os.Exit(1)
	}
}
