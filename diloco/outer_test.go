package diloco

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

func TestOuterConfig(t *testing.T) {
	bad := []OuterConfig{
		{LR: 0, Momentum: 0.9},
		{LR: -1},
		{LR: math.Inf(1)},
		{LR: math.NaN()},
		{LR: 1, Momentum: 1},
		{LR: 1, Momentum: -0.1},
		{LR: 1, Momentum: math.NaN()},
	}
	for _, c := range bad {
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%+v: err = %v, want ErrBadConfig", c, err)
		}
	}
	for _, c := range []OuterConfig{nodeOuter, paperOuter, {LR: 1}} {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

func TestOuterStepHandComputed(t *testing.T) {
	tests := []struct {
		name      string
		cfg       OuterConfig
		p0        float32
		grads     []float32
		wantP     []float32 // after each step
		wantMomen []float32
	}{
		{
			// m = 1, u = 1 + 0.5 = 1.5, p = 4 − 0.75; then m = 2.5, u = 3.25, p = 3.25 − 1.625.
			"nesterov, exact values", OuterConfig{LR: 0.5, Momentum: 0.5, Nesterov: true},
			4, []float32{1, 2}, []float32{3.25, 1.625}, []float32{1, 2.5},
		},
		{
			"heavy ball, exact values", OuterConfig{LR: 0.5, Momentum: 0.5},
			4, []float32{1, 2}, []float32{3.5, 2.25}, []float32{1, 2.5},
		},
		{
			// Bit patterns from an independent float32 computation (Python struct rounding).
			"the paper's config", paperOuter,
			1, []float32{0.5, -0.25}, f32s(0x3eab8520, 0x3ec49ba8), f32s(0x3f000000, 0x3e4ccccc),
		},
		{
			"no momentum", OuterConfig{LR: 0.25, Nesterov: true},
			1, []float32{2, 2}, []float32{0.5, 0}, []float32{2, 2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, m := []float32{tc.p0}, []float32{0}
			for s, g := range tc.grads {
				if err := OuterStep(p, m, []float32{g}, tc.cfg, 1); err != nil {
					t.Fatal(err)
				}
				requireBits32(t, "params", p, tc.wantP[s:s+1])
				requireBits32(t, "momentum", m, tc.wantMomen[s:s+1])
			}
		})
	}
}

// refOuter is the textbook loop, one element at a time, all in float32.
func refOuter(p, m, g []float32, lr, mu float32, nesterov bool) {
	for i := range p {
		m[i] = float32(mu*m[i]) + g[i]
		update := m[i]
		if nesterov {
			update = g[i] + float32(mu*m[i])
		}
		p[i] = p[i] - float32(lr*update)
	}
}

func TestOuterStepMatchesReference(t *testing.T) {
	for _, nesterov := range []bool{true, false} {
		cfg := OuterConfig{LR: 0.7, Momentum: 0.9, Nesterov: nesterov}
		const n = 70001
		p, m := randVec(1, n), make([]float32, n)
		rp, rm := append([]float32(nil), p...), make([]float32, n)
		for step := range 12 {
			g := randVec(uint64(100+step), n)
			if err := OuterStep(p, m, g, cfg, 3); err != nil {
				t.Fatal(err)
			}
			refOuter(rp, rm, g, float32(cfg.LR), float32(cfg.Momentum), nesterov)
			requireBits32(t, "params", p, rp)
			requireBits32(t, "momentum", m, rm)
		}
	}
}

func TestOuterStepIsFedAvgWithoutMomentum(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	const n = 5000
	p, g := randVec(4, n), randVec(5, n)
	// Signed zeros on both sides: θ − g must hold even for −0 − −0.
	p[0], g[0] = negZero(), negZero()
	p[1], g[1] = 0, negZero()
	p[2], g[2] = negZero(), 0
	for _, nesterov := range []bool{true, false} {
		for _, mom := range [][]float32{nil, make([]float32, n)} {
			if mom != nil {
				for i := range mom {
					mom[i] = float32(rng.NormFloat64()) // stale state must not leak in
				}
			}
			got := append([]float32(nil), p...)
			if err := OuterStep(got, mom, g, OuterConfig{LR: 1, Nesterov: nesterov}, 2); err != nil {
				t.Fatal(err)
			}
			want := make([]float32, n)
			for i := range want {
				want[i] = p[i] - g[i]
			}
			requireBits32(t, "params", got, want)
		}
	}
}

func TestOuterStepErrors(t *testing.T) {
	p, m, g := make([]float32, 3), make([]float32, 3), make([]float32, 3)
	tests := []struct {
		name    string
		p, m, g []float32
		cfg     OuterConfig
		want    error
	}{
		{"bad config", p, m, g, OuterConfig{LR: 0}, ErrBadConfig},
		{"short grad", p, m, g[:2], nodeOuter, ErrLengthMismatch},
		{"short momentum", p, m[:2], g, nodeOuter, ErrLengthMismatch},
		{"momentum needed", p, nil, g, nodeOuter, ErrLengthMismatch},
		{"short momentum without momentum", p, m[:1], g, OuterConfig{LR: 1}, ErrLengthMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := OuterStep(tc.p, tc.m, tc.g, tc.cfg, 0); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}
