package diloco

import (
	"github.com/p2pnode/p2pnode/internal/parallel"

	"fmt"
	"math"
)

// OuterConfig is the outer optimizer: SGD with momentum, optionally Nesterov, as in
// PyTorch's torch.optim.SGD with dampening 0 and no weight decay.
type OuterConfig struct {
	LR       float64 // > 0
	Momentum float64 // μ in [0, 1); 0 disables momentum
	Nesterov bool
}

// Validate reports an out-of-range field, naming it.
func (c OuterConfig) Validate() error {
	if !(c.LR > 0) || math.IsInf(c.LR, 0) {
		return fmt.Errorf("outer optimizer: %w: lr %v (want finite and > 0)", ErrBadConfig, c.LR)
	}
	if !(c.Momentum >= 0 && c.Momentum < 1) {
		return fmt.Errorf("outer optimizer: %w: momentum %v (want [0, 1))", ErrBadConfig, c.Momentum)
	}
	return nil
}

// OuterStep applies one outer step in place, with μ = float32(Momentum), η = float32(LR):
//
//	m ← μ·m + g
//	u ← g + μ·m   (Nesterov)   or   u ← m
//	θ ← θ − η·u
//
// every product rounded to float32 before it is added (no FMA), so validators agree to the
// bit. The momentum buffer starts as zeros; PyTorch instead copies g into it on the first
// step, which gives the same values (up to the sign of a zero).
//
// With Momentum = 0 the buffer plays no part: it may be nil, and if present it is set to g.
// That path computes θ − float32(η·g), so lr 1 and momentum 0 give exactly θ − g: FedAvg.
func OuterStep(params, momentum, grad []float32, cfg OuterConfig, workers int) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("outer step: %w", err)
	}
	if len(grad) != len(params) {
		return fmt.Errorf("outer step: %w: %d params, %d gradient elements", ErrLengthMismatch, len(params), len(grad))
	}
	if len(momentum) != len(params) && (cfg.Momentum != 0 || momentum != nil) {
		return fmt.Errorf("outer step: %w: %d params, %d momentum elements", ErrLengthMismatch, len(params), len(momentum))
	}
	lr, mu := float32(cfg.LR), float32(cfg.Momentum)
	parallel.ForChunks(len(params), parallel.ChunkLen, workers, func(_, lo, hi int) {
		p, g := params[lo:hi], grad[lo:hi]
		g = g[:len(p)]
		switch {
		case cfg.Momentum == 0:
			plainStep(p, g, lr)
			if momentum != nil {
				copy(momentum[lo:hi], g)
			}
		case cfg.Nesterov:
			nesterovStep(p, momentum[lo:hi], g, lr, mu)
		default:
			momentumStep(p, momentum[lo:hi], g, lr, mu)
		}
	})
	return nil
}

func plainStep(p, g []float32, lr float32) {
	g = g[:len(p)]
	for i := range p {
		p[i] = p[i] - float32(lr*g[i])
	}
}

func nesterovStep(p, m, g []float32, lr, mu float32) {
	m, g = m[:len(p)], g[:len(p)]
	for i := range p {
		mi := float32(mu*m[i]) + g[i]
		m[i] = mi
		u := g[i] + float32(mu*mi)
		p[i] = p[i] - float32(lr*u)
	}
}

func momentumStep(p, m, g []float32, lr, mu float32) {
	m, g = m[:len(p)], g[:len(p)]
	for i := range p {
		mi := float32(mu*m[i]) + g[i]
		m[i] = mi
		p[i] = p[i] - float32(lr*mi)
	}
}
