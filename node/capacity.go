package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/p2pnode/p2pnode/pyruntime"
)

// capacity is a trainer's training speed: samples per second (an exponential moving
// average over windows, which sizes its leases) and seconds per inner step (seeded by the
// worker's probe at start, then the same average over its windows' wall time, which a
// leader that has not seen it deliver yet sets lease deadlines from). Both are announced.
type capacity struct {
	mu       sync.Mutex
	sps      float64
	stepSecs float64
}

func (c *capacity) observe(samples, seconds float64) {
	if samples <= 0 || seconds <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sps = ema(c.sps, samples/seconds)
}

// observeWindow records a window of steps inner steps that took seconds end to end.
func (c *capacity) observeWindow(steps int, seconds float64) {
	if steps <= 0 || seconds <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stepSecs = ema(c.stepSecs, seconds/float64(steps))
}

// probed seeds the seconds per step from the worker's probe unless a window measured it.
func (c *capacity) probed(stepSecs float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stepSecs == 0 && stepSecs > 0 {
		c.stepSecs = stepSecs
	}
}

func ema(old, x float64) float64 {
	if old == 0 {
		return x
	}
	return 0.7*old + 0.3*x
}

func (c *capacity) get() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sps
}

func (c *capacity) stepSeconds() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stepSecs
}

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
func probeSpeed(ctx context.Context, e *env, c *capacity) {
	p, ok := e.rt.(prober)
	if !ok || e.data == nil || len(e.data.plan.Shards) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	start := time.Now()
	paths, err := e.data.Paths(ctx, []uint32{0})
	if err == nil {
		var r pyruntime.ProbeResult
		if r, err = p.Probe(ctx, paths, probeSteps); err == nil {
			c.probed(r.SecondsPerStep)
			e.log.Info("probed training speed", "seconds_per_step", fmt.Sprintf("%.4f", r.SecondsPerStep),
				"samples_per_second", fmt.Sprintf("%.1f", r.SamplesPerSecond), "took", time.Since(start).Round(time.Millisecond).String())
			return
		}
	}
	if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		e.log.Info("could not probe training speed; leaders will use lease.first_deadline until this trainer delivers a window", "err", err)
	}
}
