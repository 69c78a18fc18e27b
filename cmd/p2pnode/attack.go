//go:build attack

package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/adversary"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/node"
)

// A binary built with the attack tag (`make build TAGS=attack`) is a test build: `run
// --poison MODE` makes its trainer misbehave on purpose, for end-to-end tests of screening
// and quarantine. The default build has neither the flag nor the hooks behind it.
func init() { runHooks = append(runHooks, poisonFlag) }

// poisonFlag adds --poison to `p2pnode run`: with a mode, the node is built by
// node.NewAttacker.
func poisonFlag(cmd *cobra.Command, build *nodeBuilder) {
	var mode string
	cmd.Flags().StringVar(&mode, "poison", "", fmt.Sprintf("misbehave on purpose (attack tests): one of %v", adversary.All()))
	honest := *build
	*build = func(cfg *config.Config, opts node.Options) (*node.Node, error) {
		if mode == "" {
			return honest(cfg, opts)
		}
		m, err := adversary.Parse(mode)
		if err != nil {
			return nil, fmt.Errorf("--poison: %w", err)
		}
		return node.NewAttacker(cfg, opts, m)
	}
}
