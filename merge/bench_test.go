package merge

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

const (
	benchInputs = 8
	benchLen    = 25_000_000
)

// BenchmarkMerge8x25M compares the weighted mean of eight 25M-element inputs with the
// plainest possible single-goroutine sum of the same inputs. Both report MB/s of input
// read (8 × 25M × 4 bytes per operation). The merge is memory-bound, so the weighted
// mean's extra multiplies should cost little; the target is ≥ 0.8× the plain sum.
func BenchmarkMerge8x25M(b *testing.B) {
	xs := make([][]float32, benchInputs)
	for k := range xs {
		x := make([]float32, benchLen)
		for i := range x {
			// Ordinary normal floats: subnormals would slow both loops for reasons
			// unrelated to the merge.
			x[i] = float32(i%1000)*0.001 + float32(k)
		}
		xs[k] = x
	}
	weights := []float64{1, 2, 3, 4, 5, 6, 7, 8}
	dst := make([]float32, benchLen)

	b.Run("plain-sum", func(b *testing.B) {
		b.SetBytes(benchInputs * benchLen * 4)
		for b.Loop() {
			// dst is not cleared between iterations: clearing would add a pass the
			// baseline does not need, and the accumulated values stay small and normal.
			for _, x := range xs {
				d := dst[:len(x)]
				for i, v := range x {
					d[i] += v
				}
			}
		}
	})
	b.Run("weighted-mean", func(b *testing.B) {
		b.SetBytes(benchInputs * benchLen * 4)
		for b.Loop() {
			if err := WeightedMean(dst, xs, weights, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRobust8x1M shows what the robust aggregators and screening cost relative to the
// plain weighted mean, on eight 1M-element inputs (MB/s of input read).
func BenchmarkRobust8x1M(b *testing.B) {
	const n = 1 << 20
	xs := randVecs(1, benchInputs, n)
	w := randWeights(1, benchInputs)
	dst := make([]float32, n)
	for _, kind := range Aggregators() {
		b.Run(string(kind), func(b *testing.B) {
			b.SetBytes(benchInputs * n * 4)
			opts := AggregateOptions{TrimFraction: 0.125}
			for b.Loop() {
				if err := Aggregate(kind, dst, xs, w, opts, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("screen", func(b *testing.B) {
		b.SetBytes(benchInputs * n * 4)
		cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0)}
		for b.Loop() {
			if _, err := Screen(xs, cfg, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkScreenCohort shows how screening (norms, then cosines to the one reference per
// round) grows with the cohort: time per contribution should stay flat from 3 to 32.
// 10M values per delta, as in issue 16; -bench 'ScreenCohort/k=(3|32)$' compares the ends.
func BenchmarkScreenCohort(b *testing.B) {
	const n = 10_000_000
	for _, k := range []int{3, 8, 16, 32} {
		b.Run(fmt.Sprintf("k=%d", k), func(b *testing.B) {
			xs := randVecs(uint64(k), k, n)
			cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0)}
			b.SetBytes(int64(k) * n * 4)
			for b.Loop() {
				if _, err := Screen(xs, cfg, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkScreenTrusted is the screening math of one round of 8 updates at 10 M and
// 100 M parameters, streamed in blocks of 1 M values as round.Merger streams them (the
// same block content stands for every block, so memory stays at one block per update):
// "cohort" judges them against each other and the momentum, "trusted" against a
// validator's own reference update (SetTrusted). Both make the same two passes; the
// reference's own window is the worker's cost, not this.
func BenchmarkScreenTrusted(b *testing.B) {
	const k, block = 8, 1 << 20
	rng := rand.New(rand.NewPCG(3, 3))
	g := gauss(rng, block, 1)
	xs := noisyCohort(rng, g, k, 2)
	ref := noisyCohort(rng, g, 1, 2)[0]
	prev := noisyCohort(rng, g, 1, 2)[0]
	hist := History{Rounds: 9, Norm: 2000, Cohort: Moments{N: 9, Mean: 0.2, Var: 0.01}, Ref: Moments{N: 9, Mean: 0.2, Var: 0.01},
		Self: Moments{N: 9, Mean: 0.2, Var: 0.01}}
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	// cohort: against the cohort and momentum; trusted: against the reference; previous:
	// against the reference with the base's beside it (Screening.SetPrevious).
	for _, n := range []int{10_000_000, 100_000_000} {
		for _, mode := range []string{"cohort", "trusted", "previous"} {
			trusted, previous := mode != "cohort", mode == "previous"
			name := fmt.Sprintf("n=%dM/%s", n/1_000_000, mode)
			b.Run(name, func(b *testing.B) {
				b.SetBytes(int64(k) * int64(n) * 4)
				for b.Loop() {
					s, err := NewScreening(cfg, hist, k, n, true, 0)
					if err != nil {
						b.Fatal(err)
					}
					if trusted {
						if err := s.SetTrusted(); err != nil {
							b.Fatal(err)
						}
					}
					if previous {
						if err := s.SetPrevious(); err != nil {
							b.Fatal(err)
						}
					}
					blocks := make([][]float32, k)
					for lo := 0; lo < n; lo += block {
						m := min(block, n-lo)
						for j := range blocks {
							blocks[j] = xs[j][:m]
						}
						if err := s.AddNorms(lo, blocks); err != nil {
							b.Fatal(err)
						}
					}
					if s.NeedsCosines() {
						for lo := 0; lo < n; lo += block {
							m := min(block, n-lo)
							for j := range blocks {
								blocks[j] = xs[j][:m]
							}
							var p []float32
							if previous {
								p = prev[:m]
							}
							if err := s.AddCosinesWithPrevious(lo, blocks, ref[:m], p); err != nil {
								b.Fatal(err)
							}
						}
					}
					if _, err := s.Verdicts(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
