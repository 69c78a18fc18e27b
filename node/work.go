package node

import (
	"context"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/round"
)

// windowTrainer trains one leased window and stores its pseudo-gradient: the node's
// round.Trainer, or what a wrapWindows made of it.
type windowTrainer interface {
	Train(ctx context.Context, base *chain.Head, microshards []uint32, steps int, seed int64) (*round.Result, error)
}

// wrapWindows makes what the trainer loop trains with out of the node's round.Trainer
// (which restore and the checkpoint keep using). The graph provides honestWindows; only a
// build with the attack tag decorates it (attack.go).
type wrapWindows func(*round.Trainer) windowTrainer

// honestWindows trains with the round.Trainer as it is.
func honestWindows(t *round.Trainer) windowTrainer { return t }
