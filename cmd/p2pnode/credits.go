package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/credit"
	"github.com/p2pnode/p2pnode/node"
)

func newCreditsCmd() *cobra.Command {
	var cfgPath, head string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "credits --config FILE [--head CID|latest] [--json]",
		Short: "Show each peer's credit: contributions merged, samples trained, rejections and quarantines",
		Long: `Add up every peer's work from the head chain in the node's store (a running node's too):
contributions merged and the samples they trained (from the heads), contributions rejected
by reason and quarantines (from the round notes the validators signed). Every node that
holds the chain computes the same table. This node's row is marked.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			st, id, err := openHead(cfg, head)
			if err != nil {
				return err
			}
			self, err := node.StoredPeerID(cfg)
			if err != nil {
				return err
			}
			validators := cfg.Experiment.Validators
			if len(validators) == 0 && self != "" {
				validators = []string{self} // a node that is its own validator
			}
			l, err := st.Credits(id, validators)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(struct {
					Head     string           `json:"head"`
					Round    uint64           `json:"round"`
					Self     string           `json:"self,omitempty"`
					Accounts []credit.Account `json:"accounts"`
				}{id.String(), l.Round, self, l.Accounts()})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "head %s (round %d)\n", id, l.Round)
			return credit.WriteTable(cmd.OutOrStdout(), l.Accounts(), l.Round, self)
		},
	}
	cmd.Flags().StringVarP(&cfgPath, "config", "c", "p2pnode.yaml", "experiment config file")
	cmd.Flags().StringVar(&head, "head", "latest", "head CID to count back from, or latest")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the accounts as JSON")
	return cmd
}
