package merge

import (
	"math"
	"math/rand/v2"
	"testing"
)

// workerCounts and propSizes drive the determinism property tests: odd sizes straddle the
// 64Ki chunk and the kernel tile, odd worker counts give uneven splits.
var (
	workerCounts = []int{1, 2, 3, 8}
	propSizes    = []int{1, 7, 65537, 300001}
)

// randVec returns n values spread over many binades, with a few exact and negative zeros,
// so that rounding differences between evaluation orders would show.
func randVec(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch rng.IntN(64) {
		case 0:
			x[i] = 0
		case 1:
			x[i] = float32(math.Copysign(0, -1))
		default:
			x[i] = float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(24)-12))
		}
	}
	return x
}

func randVecs(seed uint64, k, n int) [][]float32 {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	xs := make([][]float32, k)
	for j := range xs {
		xs[j] = randVec(rng, n)
	}
	return xs
}

func randWeights(seed uint64, k int) []float64 {
	rng := rand.New(rand.NewPCG(seed, 1))
	w := make([]float64, k)
	for j := range w {
		w[j] = float64(1+rng.IntN(1000)) * (0.5 + rng.Float64())
	}
	return w
}

// f32s builds a []float32 from bit patterns, so expected values are exact.
func f32s(bits ...uint32) []float32 {
	x := make([]float32, len(bits))
	for i, b := range bits {
		x[i] = math.Float32frombits(b)
	}
	return x
}

func negZero() float32 { return float32(math.Copysign(0, -1)) }

// diffBits32 returns the first index where got and want differ in bits, or −1.
func diffBits32(got, want []float32) int {
	if len(got) != len(want) {
		return 0
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i
		}
	}
	return -1
}

func requireBits32(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: len %d, want %d", what, len(got), len(want))
	}
	if i := diffBits32(got, want); i >= 0 {
		t.Fatalf("%s: element %d = %v (%#08x), want %v (%#08x)", what, i,
			got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
	}
}

func requireBits64(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Float64bits(got) != math.Float64bits(want) {
		t.Fatalf("%s = %v (%#016x), want %v (%#016x)", what, got, math.Float64bits(got), want, math.Float64bits(want))
	}
}
