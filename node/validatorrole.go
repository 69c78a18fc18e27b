package node

import (
	"context"
	"fmt"
	"time"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/round"
	"github.com/p2pnode/p2pnode/status"
	"github.com/p2pnode/p2pnode/validator"
)

// validatorLoop is the validator role (package validator) wired to this node: its merger
// logs each stage, its trainer paces come from and go to the checkpoint keeper, and its
// signing locks are restored before it runs. A node without a workload has a nil e.rt,
// which stays nil as a validator.Runtime.
func validatorLoop(e *env) func(s *startup) (func(context.Context) error, error) {
	return func(s *startup) (func(context.Context) error, error) {
		mlog := e.log.With("component", "merge")
		p := validator.Params{
			Config: e.cfg, Self: e.self, Key: e.key, Validators: e.validators,
			Bus: e.bus, Tips: e.tips, Heads: e.heads, Store: e.store,
			Merger: &round.Merger{Store: e.store, Policy: s.policy, Observe: func(stage string, d time.Duration) {
				mlog.Debug("merge stage", "stage", stage, "seconds", d.Seconds())
			}},
			Runtime: e.rt, FetchHead: e.fetchHeadArtifacts, Sink: validatorSink{e}, Log: e.log,
		}
		if e.data != nil {
			p.Plan, p.PlanID = e.data.plan, e.data.planID
		}
		ref, err := referenceTrainer(e)
		if err != nil {
			return nil, err
		}
		if ref != nil {
			p.Reference = ref
		}
		p.RequireReference = e.cfg.Merge.Screen.Reference == config.ReferenceOn
		if e.keeper != nil {
			p.Paces, p.TrackPaces = e.keeper.RestoredPaces(), e.keeper.TrackPaces
		}
		v, err := validator.New(p)
		if err != nil {
			return nil, err
		}
		return v.Run, nil
	}
}

// referenceTrainer is the validator's reference window (validator/reference.go), trained
// through the node's own worker beside its training, if any, with scratch files of its
// own, from a fresh inner optimizer every round: the reference then depends only on the
// round (any validator can train it again), and its norm is what an honest newcomer's
// first window makes, the largest an honest window is (a warm optimizer's windows of a
// converged run are far smaller). nil when merge.screen.reference is off, or auto on a
// node without a workload.
func referenceTrainer(e *env) (*round.Trainer, error) {
	switch e.cfg.Merge.Screen.Reference {
	case config.ReferenceOff:
		return nil, nil
	case config.ReferenceOn:
		if e.rt == nil || e.data == nil {
			return nil, fmt.Errorf("merge.screen.reference is on, but this validator runs no workload to train its reference with (set workload.factory, or reference: auto)")
		}
	}
	if e.rt == nil || e.data == nil {
		return nil, nil
	}
	return &round.Trainer{Runtime: e.rt, Store: e.store, Shards: e.data, Codec: diloco.FP32, Prefix: "reference-", Fresh: true}, nil
}

// validatorSink puts what the validator role does on the status page and the metrics.
type validatorSink struct{ e *env }

// Status changes a copy of the validator's status and publishes the copy, so a snapshot
// being read is never changed under its reader.
func (s validatorSink) Status(fn func(vs *validator.Status)) {
	s.e.status.Update(func(st *status.Status) {
		var vs validator.Status
		if st.Validator != nil {
			vs = *st.Validator
		}
		fn(&vs)
		st.Validator = &vs
	})
}

func (s validatorSink) Event(kind, format string, args ...any) {
	s.e.status.Event(kind, format, args...)
}
func (s validatorSink) Rejected(reason string)    { s.e.metrics.Rejected(reason) }
func (s validatorSink) LeaseEnded(how string)     { s.e.metrics.LeaseEnded(how) }
func (s validatorSink) MetricDropped(name string) { s.e.metrics.MetricDropped(name) }

func (s validatorSink) RoundClosed(took time.Duration, merged int, notes *chain.Notes) {
	s.e.metrics.RoundClosed(took, merged)
	s.e.metrics.RoundSplit(notes)
}
