package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/node"
)

// nodeBuilder makes the node `p2pnode run` runs.
type nodeBuilder func(cfg *config.Config, opts node.Options) (*node.Node, error)

// runHooks add flags to `p2pnode run` and may replace how it builds its node. Empty in the
// default build; a build with the attack tag adds --poison (attack.go).
var runHooks []func(cmd *cobra.Command, build *nodeBuilder)

func newRunCmd(g *globalFlags) *cobra.Command {
	var path string
	build := nodeBuilder(node.New)
	cmd := &cobra.Command{
		Use:   "run --config FILE",
		Short: "Run a node from an experiment config",
		Long: `Run a node with the roles the config gives it. Progress (one line per round) goes to
stdout, logs to stderr. The node resumes from its store directory when restarted, and
stops after experiment.rounds rounds (0 = until interrupted).`,
		Example: "  p2pnode run --config configs/digits-local.yaml",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(path)
			if err != nil {
				return err
			}
			return runConfig(cmd, g, cfg, build, func(n *node.Node) {
				fmt.Fprintf(cmd.OutOrStdout(), "p2pnode %s: %s/%s as %v, store %s\n", n.ID(), cfg.Experiment.Network, cfg.Experiment.ID, cfg.Experiment.Roles, cfg.Node.StoreDir)
			})
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "p2pnode.yaml", "experiment config file")
	for _, hook := range runHooks {
		hook(cmd, &build)
	}
	return cmd
}

// runConfig builds cfg's node with build and runs it until it stops; built is called
// before it starts.
func runConfig(cmd *cobra.Command, g *globalFlags, cfg *config.Config, build nodeBuilder, built func(*node.Node)) error {
	o, err := newOutputs(g, cfg.Node.LogLevel, cmd.OutOrStdout(), cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	n, err := build(cfg, node.Options{Progress: o.out, Logger: o.log, Work: o.work})
	if err != nil {
		return err
	}
	if built != nil {
		built(n)
	}
	return n.Run(cmd.Context())
}
