package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/docker/fleet"
)

func newFleetConfigCmd() *cobra.Command {
	var o fleet.Options
	cmd := &cobra.Command{
		Use:   "fleet-config --dir DIR",
		Short: "Write the configs of the docker-compose fleet (docker/fleet.sh)",
		Long: `Write DIR/<node>.yaml for a containerised swarm (one validator that is also the
bootstrap node, and trainers), DIR/dataset.yaml, and the validator's identity
(DIR/validator.key, kept if it exists, so rewriting keeps the experiment's validator).
docker/fleet.sh runs this from the image, so a fleet needs only Docker and the image.`,
		Example: "  p2pnode fleet-config --dir .p2pnode/fleet --trainers 8 --rounds 30",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := fleet.Write(o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %d node configs to %s\nvalidator %s\nbootstrap %s\n", len(f.Names), f.Dir, f.ValidatorID, f.Bootstrap)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.Dir, "dir", ".p2pnode/fleet", "directory to write the configs to (mounted at /config)")
	cmd.Flags().IntVar(&o.Trainers, "trainers", 8, "trainer configs to write (compose.yaml runs 3, compose.scale.yaml 8)")
	cmd.Flags().IntVar(&o.Rounds, "rounds", 30, "experiment.rounds (0: run until stopped)")
	cmd.Flags().IntVar(&o.InnerSteps, "inner-steps", 0, "protocol.inner_steps (0: the demo's)")
	cmd.Flags().DurationVar(&o.RoundTimeout, "round-timeout", 0, "lease.round_timeout (0: the demo's)")
	cmd.Flags().BoolVar(&o.Attacker, "attacker", true, "also write attacker.yaml (compose.poison.yaml)")
	return cmd
}
