package merge

import (
	"errors"
	"math"
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

// screenWithPrevious screens deltas against the trusted reference ref with prev, the
// base's reference (Screening.SetPrevious), in one block.
func screenWithPrevious(t *testing.T, deltas [][]float32, ref, prev []float32, hist History, cfg ScreenConfig, workers int) ([]Verdict, float64) {
	t.Helper()
	s, err := NewScreening(cfg, hist, len(deltas), len(ref), true, workers)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetTrusted(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPrevious(); err != nil {
		t.Fatal(err)
	}
	if err := s.AddNorms(0, deltas); err != nil {
		t.Fatal(err)
	}
	if !s.NeedsCosines() {
		t.Fatal("no cosine pass")
	}
	blocks := make([][]float32, len(deltas))
	for _, k := range s.Active() {
		blocks[k] = deltas[k]
	}
	if err := s.AddCosinesWithPrevious(0, blocks, ref, prev); err != nil {
		t.Fatal(err)
	}
	vs, err := s.Verdicts()
	if err != nil {
		t.Fatal(err)
	}
	return vs, s.SelfCosine()
}

// TestBaseReferenceHoldsTheBar: half a cohort whose updates turned away from the reference
// round by round has pulled the history of merged cosines to the reference down (mean
// −0.15), so the calibrated bar (about −0.39) passes them. The cosine between consecutive
// references, which no trainer trains, says what honest windows show (about 0.2 here):
// once that is known the bar stays at its mean less SelfZ spreads, and the drifted half is
// rejected while every honest update is merged. Where this round's references disagree, the
// limit falls with them, and where their history is young it does not hold.
func TestBaseReferenceHoldsTheBar(t *testing.T) {
	const n = 4096
	rng := rand.New(rand.NewPCG(9, 3))
	g := gauss(rng, n, 1)
	honest := noisyCohort(rng, g, 4, 2) // cosine to ref about 0.2
	ref := noisyCohort(rng, g, 1, 2)[0]
	prev := noisyCohort(rng, g, 1, 2)[0] // the base's reference: cosine to ref about 0.2
	var drifted [][]float32              // cosine to ref about −0.28
	for range 4 {
		d := gauss(rng, n, 1)
		for i := range d {
			d[i] -= 0.8 * g[i]
		}
		drifted = append(drifted, d)
	}
	for _, d := range drifted {
		scale := float32(Norm(honest[0], 1) / Norm(d, 1))
		for i := range d {
			d[i] *= scale
		}
	}
	deltas := append(clones(honest), drifted...)
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	drift := History{Rounds: 9, Norm: 140, Ref: Moments{N: 9, Mean: -0.15, Var: 0.0004}}
	warmSelf := drift
	warmSelf.Self = Moments{N: 9, Mean: 0.2, Var: 0.0001}
	youngSelf := drift
	youngSelf.Self = Moments{N: HistoryWarmup - 1, Mean: 0.2, Var: 0.0001}
	all := []bool{true, true, true, true, true, true, true, true}
	cases := []struct {
		name   string
		prev   []float32
		hist   History
		wantOK []bool
	}{
		{"the references agree as before: the drifted half is rejected", prev, warmSelf, []bool{true, true, true, true, false, false, false, false}},
		{"without a history of the references' cosines the calibrated bar stands", prev, drift, all},
		{"a young history of the references' cosines does not hold", prev, youngSelf, all},
		{"the references disagree this round: the limit falls with them", gauss(rng, n, 1), warmSelf, all},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vs, self := screenWithPrevious(t, deltas, ref, tc.prev, tc.hist, cfg, 2)
			dot, err := Dot(tc.prev, ref, 1)
			if err != nil {
				t.Fatal(err)
			}
			if want := dot / (Norm(tc.prev, 1) * Norm(ref, 1)); math.Abs(self-want) > 1e-9 {
				t.Errorf("SelfCosine %v, want %v", self, want)
			}
			for k, v := range vs {
				if v.Accepted != tc.wantOK[k] {
					t.Errorf("delta %d: accepted %v, want %v (cosine to reference %.3f, bar %.3f, references' cosine %.3f)", k, v.Accepted, tc.wantOK[k], v.RefCosine, v.Bar, self)
				}
			}
		})
	}
	// Followers recompute it with another worker count.
	a, sa := screenWithPrevious(t, deltas, ref, prev, warmSelf, cfg, 1)
	b, sb := screenWithPrevious(t, deltas, ref, prev, warmSelf, cfg, 4)
	if sa != sb {
		t.Fatalf("references' cosine %v with 1 worker, %v with 4", sa, sb)
	}
	for k := range a {
		if a[k].Bar != b[k].Bar || a[k].Accepted != b[k].Accepted {
			t.Fatalf("delta %d: %+v with 1 worker, %+v with 4", k, a[k], b[k])
		}
	}
}

func TestPreviousNeedsATrustedReference(t *testing.T) {
	s, err := NewScreening(ScreenConfig{}, History{}, 1, 2, true, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetPrevious(); !errors.Is(err, ErrBadOption) {
		t.Fatalf("SetPrevious without SetTrusted: %v, want ErrBadOption", err)
	}
	if c := s.SelfCosine(); !math.IsNaN(c) {
		t.Fatalf("SelfCosine without SetPrevious: %v, want NaN", c)
	}
}

// TestHistoryWithSelf: a round without the references' cosine leaves the history as it
// was; one with it folds it in.
func TestHistoryWithSelf(t *testing.T) {
	h := History{Rounds: 3, Self: Moments{N: 2, Mean: 0.3, Var: 0.01}}
	for _, c := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		if got := h.WithSelf(c); got != h {
			t.Errorf("WithSelf(%v) = %+v, want it unchanged", c, got)
		}
	}
	if got := h.WithSelf(0.6); got.Self.N != 3 || !(got.Self.Mean > 0.3) || got.Rounds != 3 {
		t.Errorf("WithSelf(0.6) = %+v", got)
	}
}
