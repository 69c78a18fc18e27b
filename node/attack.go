//go:build attack

package node

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/adversary"
	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/round"
	"github.com/p2pnode/p2pnode/trainer"
)

// NewAttacker is New for a trainer that misbehaves on purpose in the given way: fault
// injection for end-to-end tests of screening and quarantine (`p2pnode run --poison MODE`).
// It exists only in a build with the attack tag.
func NewAttacker(cfg *config.Config, opts Options, mode adversary.Mode) (*Node, error) {
	if _, err := adversary.Parse(string(mode)); err != nil {
		return nil, err
	}
	return newNode(cfg, opts, attackOption(mode))
}

// attackOption makes a node's trainer an attacker of the given mode: its round.Trainer
// corrupts each pseudo-gradient before encoding it, or its bus rewrites each contribution it
// announces, as adversary.Mode says.
func attackOption(mode adversary.Mode) fx.Option {
	warn := fx.Invoke(func(log *slog.Logger) {
		log.Warn("POISONED TRAINER: this node sends corrupted updates on purpose", "pkg", "node", "mode", mode)
	})
	if !mode.CorruptsDelta() {
		return fx.Options(warn, fx.Decorate(func(b bus.Bus, heads *chain.Store) bus.Bus {
			return &lyingBus{Bus: b, heads: heads, mode: mode}
		}))
	}
	return fx.Options(warn, fx.Decorate(func(cfg *config.Config, self peer.ID) wrapWindows {
		// Each attacker draws its own noise: with the experiment's seed alone, every noisy
		// attacker sent the same vector, and colluding copies agree with each other. The
		// colluding modes want exactly that: their direction comes from a seed every
		// attacker of the experiment derives alike.
		corrupt := mode.CorruptDelta(uint64(trainer.Seed(cfg.Experiment.Seed, 0, 0, self.String())),
			uint64(trainer.Seed(cfg.Experiment.Seed, 0, 0, "colluders")))
		return func(t *round.Trainer) trainer.Window {
			return corruptingTrainer{Trainer: t, corrupt: corrupt}
		}
	}))
}

// corruptingTrainer trains as its round.Trainer does, but corrupts each window's
// pseudo-gradient before it is encoded. A corrupted delta that is no longer finite is stored
// as raw fp32, bypassing the codecs' checks as an attacker would.
type corruptingTrainer struct {
	*round.Trainer
	corrupt func(delta []float32)
}

func (c corruptingTrainer) Train(ctx context.Context, base *chain.Head, microshards []uint32, steps int, seed int64) (*round.Result, error) {
	w, err := c.RunWindow(ctx, base, microshards, steps, seed)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	delta, err := w.Delta()
	if err != nil {
		return nil, err
	}
	c.corrupt(delta)
	if merge.FirstNonFinite(delta, c.Workers) >= 0 {
		return w.StoreRaw(delta)
	}
	return w.EncodeDelta(delta)
}

// lyingBus publishes what its node publishes, except that each contribution is first
// rewritten as the mode says (adversary.Mode.Rewrite), or not sent at all.
type lyingBus struct {
	bus.Bus
	heads *chain.Store
	mode  adversary.Mode
}

func (b *lyingBus) Publish(ctx context.Context, msg any) error {
	c, ok := msg.(*gossip.Contribution)
	if !ok {
		return b.Bus.Publish(ctx, msg)
	}
	baseID, err := cid.Cast(c.Base)
	if err != nil {
		return fmt.Errorf("attacker (%s): contribution of round %d: base: %w", b.mode, c.Round, err)
	}
	_, base, err := b.heads.Get(baseID)
	if err != nil {
		return fmt.Errorf("attacker (%s): contribution of round %d: base head %s: %w", b.mode, c.Round, baseID, err)
	}
	if !b.mode.Rewrite(c, base) {
		return nil
	}
	return b.Bus.Publish(ctx, c)
}
