package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/p2pnode/p2pnode/pyruntime"
	"github.com/p2pnode/p2pnode/trainer"
)

// Probing a trainer's speed at start.
const (
	probeSteps   = 5
	probeTimeout = 10 * time.Second
)

// prober is a runtime that can measure its training speed (the Python worker can; the
// checkpoint-command backend cannot).
type prober interface {
	Probe(ctx context.Context, shards []string, steps int) (pyruntime.ProbeResult, error)
}

// probeSpeed measures the worker's seconds per inner step on the plan's first microshard
// before the trainer announces itself, so that a round's leader that has not seen this
// trainer deliver a window yet (round 1 of a fresh experiment, a validator that lost its
// state) sets its lease deadline from the lease's steps and this speed instead of
// lease.first_deadline. A probe that cannot run (no such capability, no data within
// probeTimeout) leaves the speed unknown; it never stops the trainer.
func probeSpeed(ctx context.Context, e *env, data *dataState, c *trainer.Capacity) {
	p, ok := e.rt.(prober)
	if !ok || data == nil || len(data.plan.Shards) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	start := time.Now()
	paths, err := data.Paths(ctx, []uint32{0})
	if err == nil {
		var r pyruntime.ProbeResult
		if r, err = p.Probe(ctx, paths, probeSteps); err == nil {
			c.Probed(r.SecondsPerStep)
			e.log.Info("probed training speed", "seconds_per_step", fmt.Sprintf("%.4f", r.SecondsPerStep),
				"samples_per_second", fmt.Sprintf("%.1f", r.SamplesPerSecond), "took", time.Since(start).Round(time.Millisecond).String())
			return
		}
	}
	if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		e.log.Info("could not probe training speed; leaders will use lease.first_deadline until this trainer delivers a window", "err", err)
	}
}
