package node

import (
	"math"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
)

// windowShare is the microshards a trainer of average speed is leased this round:
// lease.microshards_per_trainer, raised so that one window (protocol.inner_steps × the
// workload's samples per step) reads each leased example once (lease.WindowShare), with
// the plan's example counts as the size of a microshard. Samples per step are what the
// last verified proposal's windows showed (observeWindows), else workload.config.batch_size
// from this node's config; with neither (a fresh validator whose workload has no such key)
// the configured share stands until a round has been merged.
func (v *validator) windowShare() int {
	per := v.cfg.Lease.MicroshardsPerTrainer
	if v.data == nil || v.data.plan == nil {
		return per
	}
	perStep, from := v.stepSamples, "the last merged round"
	if perStep == 0 {
		perStep, from = configBatch(v.cfg.Workload.Config), "workload.config.batch_size"
	}
	plan := v.data.plan
	share := lease.WindowShare(per, v.cfg.Protocol.InnerSteps, perStep, len(plan.Shards), plan.Examples())
	if share != v.shareLogged {
		v.shareLogged = share
		if share > per {
			v.log.Info("leasing more microshards than lease.microshards_per_trainer: a window's samples need them",
				"microshards", share, "microshards_per_trainer", per, "inner_steps", v.cfg.Protocol.InnerSteps,
				"samples_per_step", perStep, "samples_per_step_from", from,
				"examples_per_microshard", float64(plan.Examples())/float64(len(plan.Shards)))
		}
	}
	return share
}

// configBatch is workload.config.batch_size when it is a positive whole number (every
// shipped workload reads its batch size from that key), else 0: unknown.
func configBatch(c map[string]any) int {
	var f float64
	switch b := c["batch_size"].(type) {
	case int:
		return max(b, 0)
	case int64:
		f = float64(b)
	case uint64:
		f = float64(b)
	case float64:
		f = b
	default:
		return 0
	}
	if f < 1 || f != math.Trunc(f) || f > math.MaxInt32 {
		return 0
	}
	return int(f)
}

// observeWindows takes the samples per inner step from a verified (or this node's own)
// proposal: each candidate's reported samples over the steps of the lease it names. Every
// validator that verifies the proposal sees the same leases and candidates, so whichever
// leads the next round sizes its leases alike.
func (v *validator) observeWindows(p *gossip.Proposal) {
	if p == nil {
		return
	}
	steps := make(map[cid.Cid]uint32, len(p.Leases))
	for i := range p.Leases {
		steps[p.Leases[i].ID()] = p.Leases[i].Steps
	}
	var ws []lease.Window
	for _, c := range p.Candidates {
		id, err := cid.Cast(c.Lease)
		if err != nil {
			continue
		}
		if s, ok := steps[id]; ok {
			ws = append(ws, lease.Window{Samples: c.Samples, Steps: s})
		}
	}
	if n := lease.StepSamples(ws); n > 0 {
		v.stepSamples = n
	}
}
