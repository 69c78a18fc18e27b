package node

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/fx"
	"golang.org/x/sys/unix"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/round"
	"github.com/p2pnode/p2pnode/status"
	"github.com/p2pnode/p2pnode/trainer"
	"github.com/p2pnode/p2pnode/upkeep"
)

// wrapWindows makes what the trainer role trains with out of the node's round.Trainer
// (which restore and the checkpoint keep using). The graph provides honestWindows; only a
// build with the attack tag decorates it (attack.go).
type wrapWindows func(*round.Trainer) trainer.Window

// honestWindows trains with the round.Trainer as it is.
func honestWindows(t *round.Trainer) trainer.Window { return t }

// trainerDeps are what the trainer role needs of the node.
type trainerDeps struct {
	fx.In
	Cfg        *config.Config
	Log        *slog.Logger
	Self       peer.ID
	Validators validatorPeers
	Bus        bus.Bus
	Tips       *chain.Tips
	Heads      *chain.Store
	Wrap       wrapWindows
	Keeper     *upkeep.Keeper
	Status     *status.Board
	Metrics    *status.Metrics
}

// trainerRole is the trainer role (package trainer) wired to this node. It subscribes to
// the bus when it is made, before any loop runs: the announcer's first announcement
// (which may be a restarted trainer's, that its leader answers with a grant at once)
// races the role's start otherwise. In CI a restarted trainer's grant, published 11 ms
// after it resumed, was lost that way; the leader waited out a 30-s deadline and barred it.
type trainerRole struct {
	trainerDeps
	in *bus.Inbox
}

func newTrainerRole(d trainerDeps) *trainerRole {
	// Run closes the inbox; a node that stops before its loops run drops its bus with it.
	return &trainerRole{trainerDeps: d, in: d.Bus.Subscribe()}
}

func (*trainerRole) name() string { return "trainer" }

func (r *trainerRole) run(ctx context.Context, s *startup) error {
	log := r.Log.With("pkg", "node")
	work := r.Wrap(s.work)
	var eager trainer.Eager
	if r.Cfg.Protocol.Overlap == config.OverlapEager {
		// Windows trained ahead train with the round.Trainer itself: a decorated one (the
		// attack build's) would corrupt only the windows trained after a wait.
		if honest, ok := work.(*round.Trainer); ok {
			eager = honest
		} else {
			log.Warn("protocol.overlap: eager is off on this node: its windows are decorated (attack build)")
		}
	}
	return trainer.New(trainer.Params{
		Experiment: r.Cfg.Experiment.ID, Seed: r.Cfg.Experiment.Seed, InnerSteps: r.Cfg.Protocol.InnerSteps,
		Rounds: r.Cfg.Experiment.Rounds, Self: r.Self.String(), IsValidator: func(p string) bool { return slices.Contains(r.Validators, p) },
		Bus: r.Bus, Inbox: r.in, Chain: chainView{r.Tips, r.Heads}, Work: work, Eager: eager, Capacity: s.capacity,
		Sink: trainerSink{r.Keeper, r.Status, r.Metrics}, Log: log, Room: storeRoom(r.Cfg.Node.StoreDir, s.params),
	}).Run(ctx)
}

// minLeaseRoom is the least free space a trainer's store needs to take a lease, whatever
// the model: heads, round notes and a small model's packs.
const minLeaseRoom = 1 << 20

// storeRoom is trainer.Params.Room for a store in dir and a model of params parameters: a
// lease needs room for its base parameters, its update and the next head's parameters
// (three fp32 copies of the model). A file system that cannot be asked passes: the lease
// then fails where the write does.
func storeRoom(dir string, params int64) func() error {
	need := max(3*4*params, minLeaseRoom)
	return func() error {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			return nil
		}
		if free := int64(st.Bavail) * int64(st.Bsize); free < need {
			return fmt.Errorf("node.store_dir %s has %d bytes free, a lease needs %d: free space on its disk", dir, free, need)
		}
		return nil
	}
}

// chainView is the canonical head (tips) and the head store, as the roles read them.
type chainView struct {
	tips  *chain.Tips
	heads *chain.Store
}

func (c chainView) Current() (cid.Cid, *chain.Head) { return c.tips.Current() }
func (c chainView) Changed() <-chan struct{}        { return c.tips.Changed() }
func (c chainView) Head(id cid.Cid) (*chain.Head, error) {
	_, h, err := c.heads.Get(id)
	return h, err
}

// trainerSink puts what the trainer role does on the status page and the metrics, and
// gives the checkpoint keeper the inner optimizer's latest state.
type trainerSink struct {
	keeper  *upkeep.Keeper
	status  *status.Board
	metrics *status.Metrics
}

func (s trainerSink) Holding(l *trainer.Held) {
	s.status.Update(func(st *status.Status) {
		st.Leases = nil
		if l != nil {
			st.Leases = []status.LeaseStatus{{Round: l.Round, Lease: l.Lease.String(), Microshards: l.Microshards, Expiry: l.Expiry}}
		}
	})
}

func (s trainerSink) Trained(t trainer.Trained) {
	s.keeper.Trained(t.OptState)
	s.status.Update(func(st *status.Status) {
		st.Last = &status.ContributionInfo{Round: t.Round, Delta: t.Delta.String(), Samples: t.Samples, Loss: t.Loss, Seconds: t.Seconds, At: time.Now()}
		if w := t.Window; w.Overlap {
			if st.Overlap == nil {
				st.Overlap = &status.OverlapStatus{}
			}
			st.Overlap.Windows++
			if w.Ahead {
				st.Overlap.Ahead++
				st.Overlap.LastMovedAt, st.Overlap.LastSteps = w.MovedAt, w.Steps
			}
		}
	})
	s.metrics.Trained(t.Samples, t.TrainSeconds, t.Loss, t.Window)
}

func (s trainerSink) Event(kind, format string, args ...any) { s.status.Event(kind, format, args...) }
