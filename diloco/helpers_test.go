package diloco

import (
	"math"
	"math/rand/v2"
	"testing"
)

var (
	// paperOuter is the DiLoCo paper's outer step (lr 0.7, Nesterov 0.9): the golden and
	// bit-pattern tests were written with it, so their digests stay.
	paperOuter = OuterConfig{LR: 0.7, Momentum: 0.9, Nesterov: true}
	// nodeOuter is config's default outer step (lr 1.0, Nesterov 0.5).
	nodeOuter    = OuterConfig{LR: 1, Momentum: 0.5, Nesterov: true}
	workerCounts = []int{1, 2, 3, 8}
	propSizes    = []int{1, 7, 65537, 300001}
)

// randVec returns n values over many binades, with some exact and negative zeros.
func randVec(seed uint64, n int) []float32 {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	x := make([]float32, n)
	for i := range x {
		switch rng.IntN(64) {
		case 0:
			x[i] = 0
		case 1:
			x[i] = float32(math.Copysign(0, -1))
		default:
			x[i] = float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(16)-12))
		}
	}
	return x
}

func f32s(bits ...uint32) []float32 {
	x := make([]float32, len(bits))
	for i, b := range bits {
		x[i] = math.Float32frombits(b)
	}
	return x
}

func negZero() float32 { return float32(math.Copysign(0, -1)) }

func requireBits32(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: len %d, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d = %v (%#08x), want %v (%#08x)", what, i,
				got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}
