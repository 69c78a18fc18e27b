package merge

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestTrustedReferenceJudgesHalfACohort: with the validator's own update as the reference,
// half a cohort sending sign flips, ×1000 or noise is rejected and every honest update is
// merged, however many attack; a pair of honest updates of different norms (a volunteer's
// short window beside an owner's full one) is not judged against itself.
func TestTrustedReferenceJudgesHalfACohort(t *testing.T) {
	const n = 4096
	rng := rand.New(rand.NewPCG(42, 1))
	g := gauss(rng, n, 1)
	// Honest cosines to the reference about 0.2, to each other as low: a converged run's.
	honest := noisyCohort(rng, g, 4, 2)
	ref := noisyCohort(rng, g, 1, 2)[0]
	// Honest windows that point along the reference less than noise does (cosines about
	// 0.04, under the noise bar 4/√4096 = 0.0625): a converged run's.
	weak := noisyCohort(rng, g, 2, 12)
	warm := History{Rounds: 9, Norm: 140, Ref: Moments{N: 9, Mean: 0.2, Var: 0.0004}}
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	noise := func(d []float32) []float32 {
		return scaled(gauss(rng, n, 1), float32(Norm(d, 1)/Norm(gauss(rng, n, 1), 1)))
	}
	cases := []struct {
		name    string
		deltas  [][]float32
		hist    History
		wantOK  []bool
		reasons map[int]Reason
	}{
		{"4 honest + 4 sign flips, cold history", append(clones(honest), scaled(honest[0], -1), scaled(honest[1], -1), scaled(honest[2], -1), scaled(honest[3], -1)),
			History{}, []bool{true, true, true, true, false, false, false, false}, map[int]Reason{4: ReasonLowCosine}},
		{"4 honest + 4 sign flips, warm history", append(clones(honest), scaled(honest[0], -1), scaled(honest[1], -1), scaled(honest[2], -1), scaled(honest[3], -1)),
			warm, []bool{true, true, true, true, false, false, false, false}, map[int]Reason{7: ReasonLowCosine}},
		{"2 honest + 2 ×1000", [][]float32{honest[0], scaled(honest[1], 1000), honest[2], scaled(honest[3], 1000)},
			warm, []bool{true, false, true, false}, map[int]Reason{1: ReasonNormOutlier}},
		{"2 honest + 2 noise at the honest norm", [][]float32{honest[0], noise(honest[1]), honest[2], noise(honest[3])},
			warm, []bool{true, false, true, false}, map[int]Reason{3: ReasonLowCosine}},
		{"a lone sign flip in a young chain", [][]float32{scaled(honest[0], -1)}, History{}, []bool{false}, map[int]Reason{0: ReasonLowCosine}},
		{"honest cosines fallen below the calibrated bar", clones(honest),
			History{Rounds: 9, Norm: 140, Ref: Moments{N: 9, Mean: 0.85, Var: 0.0004}}, []bool{true, true, true, true}, nil},
		{"no update clears the floor: only those pointing away are rejected", [][]float32{weak[0], weak[1], scaled(weak[0], -1), scaled(weak[1], -1)},
			warm, []bool{true, true, false, false}, map[int]Reason{2: ReasonLowCosine}},
		{"an honest pair of norms 2:1", [][]float32{honest[0], scaled(honest[1], 0.5)}, warm, []bool{true, true}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vs, err := ScreenTrusted(tc.deltas, ref, tc.hist, nil, cfg, 2)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range vs {
				if v.Accepted != tc.wantOK[k] {
					t.Errorf("delta %d: accepted %v, want %v (%+v)", k, v.Accepted, tc.wantOK[k], v)
				}
				if want, ok := tc.reasons[k]; ok && v.Reason != want {
					t.Errorf("delta %d: reason %q, want %q", k, v.Reason, want)
				}
				if strings.HasPrefix(tc.name, "no update clears") && v.RefCosine >= NoiseBar(n) {
					t.Errorf("delta %d: cosine %v clears the floor; the case needs weaker updates", k, v.RefCosine)
				}
				if v.Accepted && !v.Trusted {
					t.Errorf("delta %d: accepted without the trusted check", k)
				}
			}
		})
	}
}

// TestTrustedReferenceDeterministic: verdicts against a trusted reference do not depend on
// the worker count (followers recompute the leader's).
func TestTrustedReferenceDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	g := gauss(rng, 5000, 1)
	deltas := noisyCohort(rng, g, 6, 3)
	ref := noisyCohort(rng, g, 1, 3)[0]
	cfg := ScreenConfig{MaxNormRatio: 3, MinCosine: new(0.1), CosineTolerance: 4}
	a, err := ScreenTrusted(deltas, ref, History{}, nil, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ScreenTrusted(deltas, ref, History{}, nil, cfg, 4)
	if err != nil {
		t.Fatal(err)
	}
	for k := range a {
		if a[k].RefCosine != b[k].RefCosine || a[k].Accepted != b[k].Accepted || a[k].Norm != b[k].Norm {
			t.Fatalf("delta %d: %+v with 1 worker, %+v with 4", k, a[k], b[k])
		}
	}
}

func TestTrustedNeedsAReference(t *testing.T) {
	_, err := ScreenTrusted([][]float32{{1, 2}}, nil, History{}, nil, ScreenConfig{}, 1)
	if !errors.Is(err, ErrBadOption) {
		t.Fatalf("no reference: got %v, want ErrBadOption", err)
	}
}

// TestTrustedZeroReferenceJudgesNothing: a reference that did not move says nothing about
// direction; only the absolute checks stand.
func TestTrustedZeroReferenceJudgesNothing(t *testing.T) {
	vs, err := ScreenTrusted([][]float32{{1, 2}, {-1, -2}}, []float32{0, 0}, History{}, nil, ScreenConfig{MaxNorm: 10, MinCosine: new(0.0)}, 1)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range vs {
		if !v.Accepted {
			t.Fatalf("delta %d rejected against a zero reference: %+v", k, v)
		}
	}
}

func clones(xs [][]float32) [][]float32 {
	out := make([][]float32, len(xs))
	for i, x := range xs {
		out[i] = append([]float32(nil), x...)
	}
	return out
}

// TestVolunteerPairIsNotANormOutlier reproduces issue 42's honest quarantine: an owner
// that trains and validates, converged (its warm optimizer's windows tiny), and a volunteer
// whose first windows, from a fresh optimizer, are 10–20× larger. A pair's yardstick was
// the smaller of the two (and the history's typical norm, the owner's): the volunteer was
// a norm_outlier. Against a reference window trained from a fresh optimizer, as a newcomer's
// is, both are merged; ×1000 still is not.
func TestVolunteerPairIsNotANormOutlier(t *testing.T) {
	const n = 4096
	rng := rand.New(rand.NewPCG(99, 4))
	g := gauss(rng, n, 1)
	unit := func(x []float32, norm float64) []float32 { return scaled(x, float32(norm/Norm(x, 1))) }
	cohort := noisyCohort(rng, g, 3, 2)
	owner, volunteer, ref := unit(cohort[0], 0.035), unit(cohort[1], 0.73), unit(cohort[2], 0.6)
	hist := History{Rounds: 98, Norm: 0.04, Ref: Moments{N: 98, Mean: 0.2, Var: 0.004}}
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}

	old, err := ScreenWith([][]float32{owner, volunteer}, nil, hist, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	if old[1].Accepted || old[1].Reason != ReasonNormOutlier {
		t.Fatalf("without a reference the volunteer was a norm_outlier (the issue's case); got %+v", old[1])
	}
	for _, d := range [][][]float32{{owner, volunteer}, {volunteer}} {
		vs, err := ScreenTrusted(d, ref, hist, []bool{false, true}[:len(d)], cfg, 1)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range vs {
			if !v.Accepted {
				t.Fatalf("honest delta %d of %d rejected against the reference: %+v", k, len(d), v)
			}
		}
	}
	vs, err := ScreenTrusted([][]float32{owner, scaled(volunteer, 1000)}, ref, hist, nil, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	if vs[1].Accepted || vs[1].Reason != ReasonNormOutlier {
		t.Fatalf("×1000 against the reference: %+v", vs[1])
	}
}
