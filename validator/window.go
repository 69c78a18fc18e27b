package validator

import (
	"math"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/dataset"
	"github.com/p2pnode/p2pnode/lease"
)

// windowShare is the microshards a trainer of average speed is leased when a round leases
// to trainers trainers: lease.microshards_per_trainer, raised so that one window
// (protocol.inner_steps × samples per step) reads each leased example once, where the
// epoch holds that many for every trainer (lease.WindowShare). Where it does not, or
// where the rule cannot be checked, the leader logs it once (and again when the answer
// changes, say as trainers join) and leases as configured.
func (v *validator) windowShare(trainers int) int {
	size := windowSize(v.Config, v.Plan, trainers)
	w := lease.WindowShare(size)
	v.logWindow(size, w)
	return w.Share
}

// referenceShare is the microshards of the validator's reference window: one trainer's
// windowShare, at least one. It logs nothing: the leases' sizing is told as the leader
// grants (windowShare), and told again each time the fleet's answer and the reference's
// alternated (twice a round in every lm run).
func (v *validator) referenceShare() int {
	return max(lease.WindowShare(windowSize(v.Config, v.Plan, 1)).Share, 1)
}

// windowSize gathers what lease.WindowShare needs from the config and the plan.
func windowSize(cfg *config.Config, plan *dataset.Plan, trainers int) lease.WindowSize {
	s := lease.WindowSize{PerTrainer: cfg.Lease.MicroshardsPerTrainer, InnerSteps: cfg.Protocol.InnerSteps,
		SamplesPerStep: samplesPerStep(cfg), Trainers: trainers}
	if plan != nil {
		s.Shards = len(plan.Shards)
		for _, sh := range plan.Shards {
			s.Examples += sh.Examples
		}
	}
	return s
}

// samplesPerStep is lease.samples_per_step, else workload.config.batch_size when it is a
// positive whole number (every shipped workload reads its batch size from that key), else
// 0: unknown.
func samplesPerStep(cfg *config.Config) int {
	if cfg.Lease.SamplesPerStep > 0 {
		return cfg.Lease.SamplesPerStep
	}
	var f float64
	switch b := cfg.Workload.Config["batch_size"].(type) {
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

// windowNote is what logWindow last said, so it says each thing once; the warning that
// windows repeat their examples is said once per process, however the fleet changes.
type windowNote struct {
	share, need, trainers int
	said, warned          bool
}

func (v *validator) logWindow(s lease.WindowSize, w lease.Window) {
	n := windowNote{share: w.Share, need: w.Need, trainers: max(s.Trainers, 1), said: true, warned: v.window.warned}
	if v.window == n {
		return
	}
	v.window = n
	examples := 0.0
	if s.Shards > 0 {
		examples = float64(s.Examples) / float64(s.Shards)
	}
	switch {
	case w.Need == 0:
		v.Log.Info("leases sized by lease.microshards_per_trainer alone: a window's samples are unknown "+
			"(set lease.samples_per_step, or workload.config.batch_size, and give the dataset example counts)",
			"microshards_per_trainer", s.PerTrainer, "inner_steps", s.InnerSteps, "samples_per_step", s.SamplesPerStep,
			"plan_microshards", s.Shards, "plan_examples", s.Examples)
	case w.Repeats() && n.warned:
		v.Log.Debug("a window still repeats its leased examples", "microshards", w.Share, "microshards_a_window_needs", w.Need,
			"trainers", n.trainers)
	case w.Repeats():
		v.window.warned = true
		v.Log.Warn("a window repeats its leased examples: the epoch does not hold a window's microshards for every trainer, "+
			"so leases stay lease.microshards_per_trainer; lower protocol.inner_steps or lease.samples_per_step "+
			"(workload.config.batch_size), or use a larger dataset or fewer trainers",
			"microshards_per_trainer", s.PerTrainer, "microshards_a_window_needs", w.Need, "trainers", n.trainers,
			"plan_microshards", s.Shards, "inner_steps", s.InnerSteps, "samples_per_step", s.SamplesPerStep,
			"examples_per_microshard", examples, "passes_per_window", float64(s.InnerSteps)*float64(s.SamplesPerStep)/(examples*float64(w.Share)))
	case w.Share > s.PerTrainer:
		v.Log.Info("leasing more microshards than lease.microshards_per_trainer: a window's samples need them",
			"microshards", w.Share, "microshards_per_trainer", s.PerTrainer, "inner_steps", s.InnerSteps,
			"samples_per_step", s.SamplesPerStep, "examples_per_microshard", examples, "trainers", n.trainers)
	}
}
