package node

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/pyruntime"
	"github.com/p2pnode/p2pnode/round"
	"github.com/p2pnode/p2pnode/status"
	"github.com/p2pnode/p2pnode/upkeep"
	"github.com/p2pnode/p2pnode/validator"
)

// validatorDeps are what the validator role needs of the node.
type validatorDeps struct {
	fx.In
	Cfg        *config.Config
	Log        *slog.Logger
	Self       peer.ID
	Key        crypto.PrivKey
	Validators validatorPeers
	Bus        bus.Bus
	Tips       *chain.Tips
	Heads      *chain.Store
	Store      *artifact.Store
	Runtime    pyruntime.Runtime `optional:"true"` // absent without a workload
	FetchHead  headFetcher
	Keeper     *upkeep.Keeper
	Status     *status.Board
	Metrics    *status.Metrics
}

// validatorRole is the validator role (package validator) wired to this node: its merger
// logs each stage, its trainer paces come from and go to the checkpoint keeper, and its
// signing locks are restored before it runs. A node without a workload has a nil Runtime,
// which stays nil as a validator.Runtime.
type validatorRole struct{ validatorDeps }

func newValidatorRole(d validatorDeps) *validatorRole { return &validatorRole{d} }

func (*validatorRole) name() string { return "validator" }

func (r *validatorRole) run(ctx context.Context, s *startup) error {
	log := r.Log.With("pkg", "node")
	mlog := log.With("component", "merge")
	p := validator.Params{
		Config: r.Cfg, Self: r.Self.String(), Key: r.Key, Validators: r.Validators,
		Bus: r.Bus, Tips: r.Tips, Heads: r.Heads, Store: r.Store,
		Merger: &round.Merger{Store: r.Store, Policy: s.policy, Observe: func(stage string, d time.Duration) {
			mlog.Debug("merge stage", "stage", stage, "seconds", d.Seconds())
		}},
		Runtime: r.Runtime, FetchHead: r.FetchHead, Sink: validatorSink{r.Status, r.Metrics}, Log: log,
		Paces: r.Keeper.RestoredPaces(), TrackPaces: r.Keeper.TrackPaces,
	}
	if s.data != nil {
		p.Plan, p.PlanID = s.data.plan, s.data.planID
	}
	ref, err := referenceTrainer(r.Cfg, r.Runtime, r.Store, s.data)
	if err != nil {
		return err
	}
	if ref != nil {
		p.Reference = ref
	}
	p.RequireReference = r.Cfg.Merge.Screen.Reference == config.ReferenceOn
	v, err := validator.New(p)
	if err != nil {
		return err
	}
	return v.Run(ctx)
}

// referenceTrainer is the validator's reference window (validator/reference.go), trained
// through the node's own worker beside its training, if any, with scratch files of its
// own, from a fresh inner optimizer every round: the reference then depends only on the
// round (any validator can train it again), and its norm is what an honest newcomer's
// first window makes, the largest an honest window is (a warm optimizer's windows of a
// converged run are far smaller). nil when merge.screen.reference is off, or auto on a
// node without a workload.
func referenceTrainer(cfg *config.Config, rt pyruntime.Runtime, store *artifact.Store, data *dataState) (*round.Trainer, error) {
	switch cfg.Merge.Screen.Reference {
	case config.ReferenceOff:
		return nil, nil
	case config.ReferenceOn:
		if rt == nil || data == nil {
			return nil, fmt.Errorf("merge.screen.reference is on, but this validator runs no workload to train its reference with (set workload.factory, or reference: auto)")
		}
	}
	if rt == nil || data == nil {
		return nil, nil
	}
	return &round.Trainer{Runtime: rt, Store: store, Shards: data, Codec: diloco.FP32, Prefix: "reference-", Fresh: true}, nil
}

// validatorSink puts what the validator role does on the status page and the metrics.
type validatorSink struct {
	status  *status.Board
	metrics *status.Metrics
}

// Status changes a copy of the validator's status and publishes the copy, so a snapshot
// being read is never changed under its reader.
func (s validatorSink) Status(fn func(vs *validator.Status)) {
	s.status.Update(func(st *status.Status) {
		var vs validator.Status
		if st.Validator != nil {
			vs = *st.Validator
		}
		fn(&vs)
		st.Validator = &vs
	})
}

func (s validatorSink) Event(kind, format string, args ...any) {
	s.status.Event(kind, format, args...)
}
func (s validatorSink) Rejected(reason string)    { s.metrics.Rejected(reason) }
func (s validatorSink) LeaseEnded(how string)     { s.metrics.LeaseEnded(how) }
func (s validatorSink) MetricDropped(name string) { s.metrics.MetricDropped(name) }

func (s validatorSink) RoundClosed(took time.Duration, merged int, notes *chain.Notes) {
	s.metrics.RoundClosed(took, merged)
	s.metrics.RoundSplit(notes)
}
