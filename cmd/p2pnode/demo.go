package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/internal/demo"
)

func newDemoCmd(g *globalFlags) *cobra.Command {
	o := demo.Options{}
	var resume bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Train digits on a local swarm: one validator and three trainers over loopback TCP",
		Long: `Start a validator (also the bootstrap node) and --trainers trainers as separate p2pnode
processes on this machine, talking libp2p over loopback TCP, and train an MLP on the 8x8
digits data set with DiLoCo. The validator's progress is printed per round; each node's log
is in --dir. The dataset is prepared on first use (Debian's python3-sklearn ships it).`,
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
			res, err := demo.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "demo: %d rounds in %.1fs (%.2fs per round); final held-out accuracy %.1f%%\n",
				res.Rounds, res.Seconds, res.SecondsPerRnd, 100*res.FinalAccuracy)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.Dir, "dir", ".p2pnode/demo", "directory for the demo's configs, stores, logs and data")
	cmd.Flags().IntVar(&o.Trainers, "trainers", 3, "number of trainer processes")
	cmd.Flags().IntVar(&o.Rounds, "rounds", 20, "rounds to train")
	cmd.Flags().BoolVar(&resume, "resume", false, "continue an earlier demo in --dir instead of starting fresh")
	return cmd
}
