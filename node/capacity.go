package node

import "sync"

// capacity is a trainer's training speed in samples per second: an exponential moving
// average over windows, seeded by the worker's probe.
type capacity struct {
	mu  sync.Mutex
	sps float64
}

func (c *capacity) observe(samples, seconds float64) {
	if samples <= 0 || seconds <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	x := samples / seconds
	if c.sps == 0 {
		c.sps = x
		return
	}
	c.sps = 0.7*c.sps + 0.3*x
}

func (c *capacity) get() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sps
}
