// Command p2pnode-fleet writes the configs of the docker-compose fleet (see package fleet
// and e2e/compose.yaml):
//
//	go run ./docker/fleet/cmd/p2pnode-fleet --dir .p2pnode/fleet --trainers 8 --rounds 30
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/p2pnode/p2pnode/docker/fleet"
)

func main() {
	var o fleet.Options
	flag.StringVar(&o.Dir, "dir", ".p2pnode/fleet", "directory to write the configs to (mounted at /config)")
	flag.IntVar(&o.Trainers, "trainers", 8, "trainer configs to write (compose.yaml runs 3, compose.scale.yaml 8)")
	flag.IntVar(&o.Rounds, "rounds", 30, "experiment.rounds (0: run until stopped)")
	flag.IntVar(&o.InnerSteps, "inner-steps", 0, "protocol.inner_steps (0: the demo's)")
	flag.DurationVar(&o.RoundTimeout, "round-timeout", 0, "lease.round_timeout (0: the demo's)")
	flag.BoolVar(&o.Attacker, "attacker", true, "also write attacker.yaml (compose.poison.yaml)")
	flag.Parse()
	f, err := fleet.Write(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "p2pnode-fleet:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %d node configs to %s\nvalidator %s\nbootstrap %s\n", len(f.Names), f.Dir, f.ValidatorID, f.Bootstrap)
}
