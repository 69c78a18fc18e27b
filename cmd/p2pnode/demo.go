package main

import (
	"fmt"
	"math"
	"os"

	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/codecs"
	"github.com/p2pnode/p2pnode/demo"
)

func newDemoCmd(g *globalFlags) *cobra.Command {
	o := demo.Options{}
	var resume bool
	var momentum, outerLR float64
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Train digits (or a transformer LM) on a local swarm: one validator and three trainers over loopback TCP",
		Long: `Start a validator (also the bootstrap node) and --trainers trainers as separate p2pnode
processes on this machine, talking libp2p over loopback TCP, and train an MLP on the 8x8
digits data set with DiLoCo. The validator's progress is printed per round; each node's log
is in --dir. The dataset is prepared on first use (Debian's python3-sklearn ships it).

--workload lm trains the byte-level transformer of p2ptrain.workloads.lm instead (--preset
tiny by default, ~1 M parameters) on the Python standard library's sources, and prints the
held-out loss (nats per byte) and bits per byte per round. --workload charlm trains the
byte-level GRU of p2ptrain.workloads.charlm on the same sources.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(g, "warn", os.Stderr)
			if err != nil {
				return err
			}
			bin, err := os.Executable()
			if err != nil {
				return err
			}
			o.Binary, o.Out, o.Log, o.Fresh = bin, cmd.OutOrStdout(), log, !resume
			if cmd.Flags().Changed("momentum") {
				o.Momentum = &momentum
			}
			if cmd.Flags().Changed("outer-lr") {
				o.OuterLR = &outerLR
			}
			res, err := demo.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			if o.Workload == demo.WorkloadLM || o.Workload == demo.WorkloadCharLM {
				fmt.Fprintf(cmd.OutOrStdout(), "demo: %d rounds in %.1fs (%.2fs per round); final held-out loss %.4f (%.3f bits per byte)\n",
					res.Rounds, res.Seconds, res.SecondsPerRnd, res.FinalLoss, res.FinalLoss/math.Ln2)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "demo: %d rounds in %.1fs (%.2fs per round); final held-out accuracy %.1f%%\n",
				res.Rounds, res.Seconds, res.SecondsPerRnd, 100*res.FinalAccuracy)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.Dir, "dir", ".p2pnode/demo", "directory for the demo's configs, stores, logs and data")
	cmd.Flags().IntVar(&o.Trainers, "trainers", 3, "number of trainer processes")
	cmd.Flags().IntVar(&o.Rounds, "rounds", 20, "rounds to train")
	cmd.Flags().StringVar(&o.Workload, "workload", demo.WorkloadDigits, "what to train: digits, lm (a byte-level transformer) or charlm (a byte-level GRU)")
	cmd.Flags().StringVar(&o.Preset, "preset", "", "lm preset: tiny (default), small or base")
	cmd.Flags().StringVar(&o.Codec, "codec", "", "protocol.codec of every node: "+codecs.List()+" (default fp32; compare learning across codecs)")
	cmd.Flags().StringVar(&o.Overlap, "overlap", "", "protocol.overlap of every node: eager to train the next window while the round closes (default: none)")
	cmd.Flags().Int64Var(&o.Seed, "seed", 1, "experiment.seed: the initial model, the batch orders and the lease draws (the held-out split stays)")
	cmd.Flags().Float64Var(&momentum, "momentum", 0, "protocol.diloco.momentum of every node (default: the workload's, 0.5; sparse allows at most 0.5)")
	cmd.Flags().Float64Var(&outerLR, "outer-lr", 0, "protocol.diloco.outer_lr of every node (default 1.0; on lm 1.5 with --codec sparse, 0.5 with fp32 and --overlap eager)")
	cmd.Flags().BoolVar(&resume, "resume", false, "continue an earlier demo in --dir instead of starting fresh")
	return cmd
}
