package merge

import (
	"github.com/p2pnode/p2pnode/internal/parallel"

	"fmt"
	"math"
	"sync/atomic"
)

// Reductions accumulate in float64. The order is fixed by the vector length alone: the
// vector is cut into chunks of parallel.ChunkLen elements, each chunk is summed in four interleaved
// lanes combined as (l0+l1)+(l2+l3), and chunk partials are added in chunk order. The
// product of two float32 values is exact in float64, but it is still wrapped in float64(…)
// so that no compiler may fuse it into the running sum.

// Norm returns the Euclidean norm of x. It is +Inf or NaN exactly when x holds a
// non-finite value: squares of finite float32 values cannot overflow a float64 sum.
func Norm(x []float32, workers int) float64 {
	t := parallel.ReduceChunks(len(x), workers, 1, func(lo, hi int, acc []float64) {
		acc[0] = sumSquares(x[lo:hi])
	})
	return math.Sqrt(t[0])
}

// Dot returns Σ a[i]·b[i].
func Dot(a, b []float32, workers int) (float64, error) {
	if len(a) != len(b) {
		return 0, fmt.Errorf("dot: %w: %d and %d elements", ErrLengthMismatch, len(a), len(b))
	}
	t := parallel.ReduceChunks(len(a), workers, 1, func(lo, hi int, acc []float64) {
		acc[0] = dotLanes(a[lo:hi], b[lo:hi])
	})
	return t[0], nil
}

// Cosine returns a·b / (‖a‖·‖b‖), or 0 when either vector is zero (the angle is undefined
// and "no agreement" is the safe reading for screening).
func Cosine(a, b []float32, workers int) (float64, error) {
	if len(a) != len(b) {
		return 0, fmt.Errorf("cosine: %w: %d and %d elements", ErrLengthMismatch, len(a), len(b))
	}
	t := parallel.ReduceChunks(len(a), workers, 3, func(lo, hi int, acc []float64) {
		acc[0] = dotLanes(a[lo:hi], b[lo:hi])
		acc[1] = sumSquares(a[lo:hi])
		acc[2] = sumSquares(b[lo:hi])
	})
	return cosineOf(t[0], t[1], t[2]), nil
}

// cosineOf turns a dot product and two squared norms into a cosine, 0 for a zero vector.
// One square root of the product rounds less than two (parallel vectors give exactly ±1);
// the product cannot overflow, as squared norms of float32 vectors stay below ~1e77·n.
func cosineOf(dot, aa, bb float64) float64 {
	if aa == 0 || bb == 0 {
		return 0
	}
	return dot / math.Sqrt(aa*bb)
}

// FirstNonFinite returns the lowest index i with x[i] NaN or ±Inf, or −1 if there is none.
func FirstNonFinite(x []float32, workers int) int {
	if len(x) == 0 {
		return -1
	}
	chunks := parallel.NumChunks(len(x), parallel.ChunkLen)
	// best is the lowest chunk known to hold a non-finite value. Chunks above it are
	// skipped, chunks below it are always scanned, so the answer is the lowest index
	// whatever the scheduling.
	var best atomic.Int64
	best.Store(int64(chunks))
	found := make([]int, chunks)
	parallel.ForChunks(len(x), parallel.ChunkLen, workers, func(c, lo, hi int) {
		found[c] = -1
		if int64(c) > best.Load() {
			return
		}
		for i, v := range x[lo:hi] {
			if !isFinite32(v) {
				found[c] = lo + i
				for {
					cur := best.Load()
					if int64(c) >= cur || best.CompareAndSwap(cur, int64(c)) {
						return
					}
				}
			}
		}
	})
	for _, i := range found {
		if i >= 0 {
			return i
		}
	}
	return -1
}

func sumSquares(x []float32) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(x); i += 4 {
		v := x[i : i+4 : i+4]
		a, b, c, d := float64(v[0]), float64(v[1]), float64(v[2]), float64(v[3])
		s0 += float64(a * a)
		s1 += float64(b * b)
		s2 += float64(c * c)
		s3 += float64(d * d)
	}
	for ; i < len(x); i++ {
		a := float64(x[i])
		s0 += float64(a * a)
	}
	return (s0 + s1) + (s2 + s3)
}

func dotLanes(x, y []float32) float64 {
	y = y[:len(x)]
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(x); i += 4 {
		v, w := x[i:i+4:i+4], y[i:i+4:i+4]
		s0 += float64(float64(v[0]) * float64(w[0]))
		s1 += float64(float64(v[1]) * float64(w[1]))
		s2 += float64(float64(v[2]) * float64(w[2]))
		s3 += float64(float64(v[3]) * float64(w[3]))
	}
	for ; i < len(x); i++ {
		s0 += float64(float64(x[i]) * float64(y[i]))
	}
	return (s0 + s1) + (s2 + s3)
}

// NormAccumulator computes the Norm of a vector handed over in consecutive pieces of any
// length, with Norm's bits: it sums whole parallel.ChunkLen chunks as Norm does, holding
// back at most one chunk that straddles two pieces.
type NormAccumulator struct {
	pending []float32
	total   float64
}

// Add appends the next values of the vector.
func (a *NormAccumulator) Add(x []float32) {
	if len(a.pending) > 0 {
		take := min(parallel.ChunkLen-len(a.pending), len(x))
		a.pending = append(a.pending, x[:take]...)
		x = x[take:]
		if len(a.pending) < parallel.ChunkLen {
			return
		}
		a.total += sumSquares(a.pending)
		a.pending = a.pending[:0]
	}
	for len(x) >= parallel.ChunkLen {
		a.total += sumSquares(x[:parallel.ChunkLen])
		x = x[parallel.ChunkLen:]
	}
	a.pending = append(a.pending, x...)
}

// Norm returns the norm of everything added.
func (a *NormAccumulator) Norm() float64 {
	t := a.total
	if len(a.pending) > 0 {
		t += sumSquares(a.pending)
	}
	return math.Sqrt(t)
}
