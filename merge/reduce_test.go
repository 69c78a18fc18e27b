package merge

import (
	"github.com/p2pnode/p2pnode/internal/parallel"

	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

func TestNorm(t *testing.T) {
	tests := []struct {
		name string
		x    []float32
		want float64
	}{
		{"empty", nil, 0},
		{"3-4-5", []float32{3, 4}, 5},
		{"rounded float32 inputs", []float32{0.1, 0.2, 0.3}, 0.37416575022665244},
		{"no overflow for huge values", []float32{math.MaxFloat32, math.MaxFloat32}, math.Sqrt(2 * float64(math.MaxFloat32) * float64(math.MaxFloat32))},
		{"Inf", []float32{1, float32(math.Inf(-1))}, math.Inf(1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			requireBits64(t, "norm", Norm(tc.x, 1), tc.want)
		})
	}
	if n := Norm([]float32{1, float32(math.NaN())}, 1); !math.IsNaN(n) {
		t.Errorf("norm with NaN = %v, want NaN", n)
	}
}

func TestDotAndCosine(t *testing.T) {
	tests := []struct {
		name      string
		a, b      []float32
		dot, cosv float64
	}{
		{"hand computed", []float32{1, 2, 3}, []float32{4, -5, 6}, 12, 12 / math.Sqrt(14*77)},
		{"orthogonal", []float32{1, 0}, []float32{0, 1}, 0, 0},
		{"parallel", []float32{1, 2}, []float32{2, 4}, 10, 1},
		{"opposite", []float32{1, 1}, []float32{-2, -2}, -4, -1},
		{"zero vector has cosine 0", []float32{0, 0}, []float32{1, 2}, 0, 0},
		{"empty", nil, nil, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Dot(tc.a, tc.b, 1)
			if err != nil {
				t.Fatal(err)
			}
			requireBits64(t, "dot", d, tc.dot)
			c, err := Cosine(tc.a, tc.b, 1)
			if err != nil {
				t.Fatal(err)
			}
			requireBits64(t, "cosine", c, tc.cosv)
		})
	}
	if _, err := Dot([]float32{1}, []float32{1, 2}, 0); !errors.Is(err, ErrLengthMismatch) {
		t.Errorf("Dot length mismatch: err = %v", err)
	}
	if _, err := Cosine([]float32{1}, nil, 0); !errors.Is(err, ErrLengthMismatch) {
		t.Errorf("Cosine length mismatch: err = %v", err)
	}
}

func TestFirstNonFinite(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	tests := []struct {
		name string
		x    []float32
		want int
	}{
		{"empty", nil, -1},
		{"all finite", []float32{1, -math.MaxFloat32, 0}, -1},
		{"NaN", []float32{1, nan, inf}, 1},
		{"−Inf first", []float32{-inf, 0}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := FirstNonFinite(tc.x, 1); got != tc.want {
				t.Fatalf("got %d, want %d", got, tc.want)
			}
		})
	}
}

func TestFirstNonFiniteLowestAcrossChunks(t *testing.T) {
	// Bad values in several chunks: whichever goroutine finds one first, the answer is the
	// lowest index.
	x := make([]float32, 10*parallel.ChunkLen+3)
	for _, i := range []int{9*parallel.ChunkLen + 1, 3*parallel.ChunkLen + 17, 3*parallel.ChunkLen + 5000, 10 * parallel.ChunkLen} {
		x[i] = float32(math.NaN())
	}
	for _, w := range workerCounts {
		for range 20 {
			if got := FirstNonFinite(x, w); got != 3*parallel.ChunkLen+17 {
				t.Fatalf("workers %d: got %d, want %d", w, got, 3*parallel.ChunkLen+17)
			}
		}
	}
}

// TestNormAccumulatorMatchesNorm: pieces of any length give Norm's bits.
func TestNormAccumulatorMatchesNorm(t *testing.T) {
	x := randVecs(3, 1, 3*parallel.ChunkLen+777)[0]
	want := Norm(x, 2)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		var a NormAccumulator
		for lo := 0; lo < len(x); {
			hi := min(len(x), lo+1+rng.IntN(parallel.ChunkLen*2))
			a.Add(x[lo:hi])
			lo = hi
		}
		if got := a.Norm(); math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("accumulated %v, Norm %v", got, want)
		}
	}
}
