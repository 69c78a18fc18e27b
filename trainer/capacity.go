package trainer

import "sync"

// Capacity is a trainer's training speed: samples per second (an exponential moving
// average over windows, which sizes its leases) and seconds per inner step (seeded by the
// worker's probe at start, then the same average over its windows' wall time, which a
// leader that has not seen it deliver yet sets lease deadlines from). Both are announced.
type Capacity struct {
	mu       sync.Mutex
	sps      float64
	stepSecs float64
}

// Observe records a window that trained samples in seconds of training.
func (c *Capacity) Observe(samples, seconds float64) {
	if samples <= 0 || seconds <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sps = ema(c.sps, samples/seconds)
}

// ObserveWindow records a window of steps inner steps that took seconds end to end.
func (c *Capacity) ObserveWindow(steps int, seconds float64) {
	if steps <= 0 || seconds <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stepSecs = ema(c.stepSecs, seconds/float64(steps))
}

// Probed seeds the seconds per step from the worker's probe unless a window measured it.
func (c *Capacity) Probed(stepSecs float64) {
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

// SamplesPerSecond is the measured training speed; 0 until a window is measured.
func (c *Capacity) SamplesPerSecond() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sps
}

// StepSeconds is the measured (or probed) seconds per inner step; 0 when unknown.
func (c *Capacity) StepSeconds() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stepSecs
}
