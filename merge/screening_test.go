package merge

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/p2pnode/p2pnode/internal/parallel"
)

// noisyCohort returns k updates g + σ·noise with a shared direction g; small signal gives
// the low pairwise cosines of a converged run.
func noisyCohort(rng *rand.Rand, g []float32, k int, sigma float64) [][]float32 {
	out := make([][]float32, k)
	for j := range out {
		d := make([]float32, len(g))
		for i := range d {
			d[i] = g[i] + float32(sigma*rng.NormFloat64())
		}
		out[j] = d
	}
	return out
}

func gauss(rng *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(scale * rng.NormFloat64())
	}
	return x
}

// TestScreeningBlocksMatchWhole: feeding the cohort in blocks of any multiple of the chunk
// length gives bit-identical verdicts to one block, and norms equal Norm's.
func TestScreeningBlocksMatchWhole(t *testing.T) {
	n := 3*parallel.ChunkLen + 1234
	rng := rand.New(rand.NewPCG(4, 4))
	g := gauss(rng, n, 1)
	deltas := noisyCohort(rng, g, 7, 2)
	// The sign flip is of an update of its own (a negated copy of an honest update cancels
	// that update in the others' sum, and the noise bar rejects both).
	deltas = append(deltas[:6], scaled(deltas[6], -1), scaled(deltas[1], 40), withValue(deltas[2], 5, float32(math.Inf(1))))
	ref := noisyCohort(rng, g, 1, 3)[0] // a momentum honest updates point along (cosine about 0.14)
	hist := History{Rounds: 9, Norm: 500, Cohort: Moments{N: 9, Mean: 0.2, Var: 0.01}, Ref: Moments{N: 9, Mean: 0.1, Var: 0.001}}
	cfg := ScreenConfig{MaxNormRatio: 5, MinCosine: new(0.0), CosineTolerance: 3}
	whole, err := ScreenWith(deltas, ref, hist, cfg, 3)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range whole {
		if want := Norm(deltas[k], 1); math.Float64bits(v.Norm) != math.Float64bits(want) && !math.IsInf(want, 0) {
			t.Fatalf("delta %d: norm %v, Norm says %v", k, v.Norm, want)
		}
	}
	for _, block := range []int{parallel.ChunkLen, 2 * parallel.ChunkLen, 5 * parallel.ChunkLen} {
		for _, workers := range []int{1, 4} {
			s, err := NewScreening(cfg, hist, len(deltas), n, true, workers)
			if err != nil {
				t.Fatal(err)
			}
			cut := func(lo, hi int, which []int) [][]float32 {
				b := make([][]float32, len(deltas))
				for _, k := range which {
					b[k] = deltas[k][lo:hi]
				}
				return b
			}
			all := make([]int, len(deltas))
			for k := range all {
				all[k] = k
			}
			for lo := 0; lo < n; lo += block {
				if err := s.AddNorms(lo, cut(lo, min(lo+block, n), all)); err != nil {
					t.Fatal(err)
				}
			}
			if !s.NeedsCosines() {
				t.Fatal("no cosine pass")
			}
			for lo := 0; lo < n; lo += block {
				hi := min(lo+block, n)
				if err := s.AddCosines(lo, cut(lo, hi, s.Active()), ref[lo:hi]); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.Verdicts()
			if err != nil {
				t.Fatal(err)
			}
			for k := range got {
				a, b := got[k], whole[k]
				if a.Accepted != b.Accepted || a.Reason != b.Reason || math.Float64bits(a.Cosine) != math.Float64bits(b.Cosine) ||
					math.Float64bits(a.RefCosine) != math.Float64bits(b.RefCosine) || (math.Float64bits(a.Norm) != math.Float64bits(b.Norm) && !math.IsNaN(a.Norm)) {
					t.Fatalf("block %d, %d workers, delta %d: %+v, whole %+v", block, workers, k, a, b)
				}
			}
		}
	}
	wantReasons := []Reason{"", "", "", "", "", "", ReasonLowCosine, ReasonNormOutlier, ReasonNonFinite}
	for k, v := range whole {
		if v.Reason != wantReasons[k] {
			t.Errorf("delta %d: reason %q, want %q (%+v)", k, v.Reason, wantReasons[k], v)
		}
	}
}

// warmHistory runs honest rounds of cohort size k through screening and returns the
// history, the false rejections, and the reference (a running mean of merged updates, as
// the outer momentum is).
func honestRounds(t *testing.T, cfg ScreenConfig, rounds, k, n int, signal, sigma float64, seed uint64) (History, []float32, int, int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	g := gauss(rng, n, signal)
	var hist History
	var ref []float32
	rejected, total := 0, 0
	for range rounds {
		deltas := noisyCohort(rng, g, k, sigma)
		v, err := ScreenWith(deltas, ref, hist, cfg, 2)
		if err != nil {
			t.Fatal(err)
		}
		hist = hist.Next(v)
		mean := make([]float32, n)
		for j := range deltas {
			total++
			if !v[j].Accepted {
				rejected++
			}
		}
		w := make([]float64, k)
		for j := range w {
			w[j] = 1
		}
		if err := WeightedMean(mean, deltas, w, 1); err != nil {
			t.Fatal(err)
		}
		if ref == nil {
			ref = mean
		} else {
			for i := range ref {
				ref[i] = float32(0.9*ref[i]) + mean[i]
			}
		}
	}
	return hist, ref, rejected, total
}

// TestCalibratedBarKeepsHonestUpdates: in a converged-looking run (signal small against
// noise, so honest cosines straddle zero) the fixed bar 0 rejects many honest updates and
// the calibrated bar almost none.
func TestCalibratedBarKeepsHonestUpdates(t *testing.T) {
	const rounds, k, n = 300, 3, 4096
	fixed := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0)}
	calibrated := fixed
	calibrated.CosineTolerance = 4
	_, _, rejFixed, total := honestRounds(t, fixed, rounds, k, n, 0.02, 1, 7)
	_, _, rejCal, _ := honestRounds(t, calibrated, rounds, k, n, 0.02, 1, 7)
	t.Logf("honest rejections: fixed bar %d/%d, calibrated %d/%d", rejFixed, total, rejCal, total)
	if rejFixed*10 < total {
		t.Fatalf("the fixed bar rejected only %d/%d: the test cohort is not noisy enough to show anything", rejFixed, total)
	}
	if rejCal*50 > total {
		t.Fatalf("calibrated bar rejected %d/%d honest updates (want < 2%%)", rejCal, total)
	}
}

// TestSmallCohortAgainstHistory: with one or two updates in a round, a sign flip, a ×1000
// update and noise at an honest norm are rejected against the reference and the history,
// and honest ones pass.
func TestSmallCohortAgainstHistory(t *testing.T) {
	const n = 4096
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	hist, ref, rej, total := honestRounds(t, cfg, 40, 3, n, 0.3, 1, 11)
	if rej != 0 {
		t.Fatalf("warm-up rejected %d/%d honest updates", rej, total)
	}
	rng := rand.New(rand.NewPCG(12, 12))
	g := gauss(rand.New(rand.NewPCG(11, 1)), n, 0.3) // the same direction the history saw
	honest := noisyCohort(rng, g, 2, 1)
	honestNorm := Norm(honest[0], 1)
	for _, tc := range []struct {
		name   string
		deltas [][]float32
		want   []Reason
	}{
		{"lone honest", honest[:1], []Reason{""}},
		{"two honest", honest, []Reason{"", ""}},
		{"lone sign flip", [][]float32{scaled(honest[0], -1)}, []Reason{ReasonLowCosine}},
		{"lone ×1000", [][]float32{scaled(honest[0], 1000)}, []Reason{ReasonNormOutlier}},
		{"lone noise", [][]float32{gauss(rng, n, honestNorm/math.Sqrt(n))}, []Reason{ReasonLowCosine}},
		{"honest and flip", [][]float32{honest[0], scaled(honest[1], -1)}, []Reason{"", ReasonLowCosine}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := ScreenWith(tc.deltas, ref, hist, cfg, 1)
			if err != nil {
				t.Fatal(err)
			}
			for j, want := range tc.want {
				if v[j].Reason != want {
					t.Errorf("delta %d: %q, want %q (%+v, history %+v)", j, v[j].Reason, want, v[j], hist)
				}
			}
		})
	}
}

// TestSmallCohortColdHistory: at the start of a run (history not warm) a small cohort is
// still judged by direction — against the reference at the fixed bar when there is one
// (the outer momentum from round 2 on), else a pair against each other — so noise or a
// sign flip at an honest norm is not merged because the norm checks left one or two
// survivors. A lone update with nothing to compare to is accepted.
func TestSmallCohortColdHistory(t *testing.T) {
	const n = 4096
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.2), CosineTolerance: 4}
	rng := rand.New(rand.NewPCG(21, 21))
	g := gauss(rand.New(rand.NewPCG(21, 1)), n, 0.3)
	ref := scaled(g, 2) // the previous round's merged update points the honest way
	honest := noisyCohort(rng, g, 2, 0.5)
	norm := Norm(honest[0], 1)
	noise := gauss(rng, n, norm/math.Sqrt(n))
	flip := scaled(honest[1], -1)
	cold := History{Rounds: 1, Norm: norm}
	for _, tc := range []struct {
		name   string
		deltas [][]float32
		ref    []float32
		want   []Reason
	}{
		{"ref: lone honest", honest[:1], ref, []Reason{""}},
		{"ref: two honest", honest, ref, []Reason{"", ""}},
		// With a cold history the momentum is not a yardstick yet (honest updates may turn
		// from it; see decideNorms): a pair is held to each other, and when they point apart
		// neither can be told odd, so both are (softly) rejected; a lone update passes.
		{"ref: honest and noise", [][]float32{honest[0], noise}, ref, []Reason{ReasonLowCosine, ReasonLowCosine}},
		{"ref: honest and flip", [][]float32{honest[0], flip}, ref, []Reason{ReasonLowCosine, ReasonLowCosine}},
		{"ref: lone noise", [][]float32{noise}, ref, []Reason{""}},
		{"ref: lone flip", [][]float32{flip}, ref, []Reason{""}},
		{"ref: noise, ×1000 and NaN leave a pair", [][]float32{honest[0], noise, scaled(honest[1], 1000), withValue(honest[1], 3, float32(math.NaN()))}, ref,
			[]Reason{ReasonLowCosine, ReasonLowCosine, ReasonNormOutlier, ReasonNonFinite}},
		{"zero ref: honest and noise", [][]float32{honest[0], noise}, make([]float32, n), []Reason{ReasonLowCosine, ReasonLowCosine}},
		{"no ref: two honest", honest, nil, []Reason{"", ""}},
		{"no ref: honest and noise", [][]float32{honest[0], noise}, nil, []Reason{ReasonLowCosine, ReasonLowCosine}},
		{"no ref: honest and flip", [][]float32{honest[0], flip}, nil, []Reason{ReasonLowCosine, ReasonLowCosine}},
		{"no ref: lone noise", [][]float32{noise}, nil, []Reason{""}},
		{"one round of history: lone ×1000", [][]float32{scaled(honest[0], 1000)}, nil, []Reason{ReasonNormOutlier}},
		{"no ref: honest and ×1000", [][]float32{honest[0], scaled(honest[1], 1000)}, nil, []Reason{"", ReasonNormOutlier}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hists := []History{{}, cold} // round 1, and one round of history
			if strings.HasPrefix(tc.name, "one round") {
				hists = hists[1:]
			}
			for _, h := range hists {
				v, err := ScreenWith(tc.deltas, tc.ref, h, cfg, 1)
				if err != nil {
					t.Fatal(err)
				}
				for j, want := range tc.want {
					if v[j].Reason != want {
						t.Errorf("history %+v: delta %d: %q, want %q (%+v)", h, j, v[j].Reason, want, v[j])
					}
				}
			}
		})
	}
}

// TestHistoryNextDeterministic: folding is a pure function of the verdicts; rejected
// deltas leave no trace.
func TestHistoryNextDeterministic(t *testing.T) {
	vs := []Verdict{{Accepted: true, Norm: 2, Cosine: 0.5, cohortRan: true}, {Accepted: true, Norm: 4, Cosine: 0.3, cohortRan: true},
		{Accepted: false, Reason: ReasonLowCosine, Norm: 3, Cosine: -0.9, cohortRan: true}}
	h := History{}.Next(vs)
	if h.Rounds != 1 || h.Norm != 3 || h.Cohort.N != 1 || math.Abs(h.Cohort.Mean-0.4) > 1e-15 || math.Abs(h.Cohort.Var-0.01) > 1e-15 || h.Ref.N != 0 {
		t.Fatalf("history %+v", h)
	}
	if again := (History{}).Next(vs); again != h {
		t.Fatalf("not deterministic: %+v vs %+v", again, h)
	}
	if same := h.Next(vs[2:]); same != h {
		t.Fatalf("a round with nothing accepted changed the history: %+v", same)
	}
}

// convergedHistory is a warm history like that of a digits run with nine trainers after
// convergence (`p2pnode demo --trainers 9`, rounds 15–30: cohort cosines of accepted
// updates from −0.12 to 0.4, mean about 0.12, so the calibrated cohort bar mean − 4 ×
// spread had fallen to about −0.7; cosines to the momentum 0.14–0.46, mean about 0.31).
// Norms as in attackedCohort (about 135).
func convergedHistory() History {
	return History{Rounds: 40, Norm: 130, Cohort: Moments{N: 40, Mean: 0.12, Var: 0.04}, Ref: Moments{N: 39, Mean: 0.31, Var: 0.0025}}
}

// attackedCohort returns six honest updates of a converging run (pairwise cosine about
// 0.1) and three updates that are each an attacker's own honest update, transformed.
func attackedCohort(n int, seed uint64, attack func(rng *rand.Rand, d []float32) []float32) ([][]float32, []float32) {
	rng := rand.New(rand.NewPCG(seed, 3))
	g := gauss(rng, n, 1.0/3)
	deltas := noisyCohort(rng, g, 9, 1)
	for j := 6; j < 9; j++ {
		deltas[j] = attack(rng, deltas[j])
	}
	return deltas, g
}

func flipAttack(_ *rand.Rand, d []float32) []float32 { return scaled(d, -1) }

func noiseAttack(rng *rand.Rand, d []float32) []float32 {
	return gauss(rng, len(d), Norm(d, 1)/math.Sqrt(float64(len(d))))
}

// TestCoordinatedSignFlipAfterQuarantine: three of nine trainers flip their updates in the
// same round once the history is warm (the digits process row: the flippers came back from
// quarantine at round 11 and all three flips were merged, because the calibrated bar had
// fallen below zero and three agreeing flips pull the others' sum). A warm cohort is held
// to the momentum as well, which only merged updates make: the flips (cosine to it about
// −0.3) are rejected and the six honest updates (about +0.3) pass.
func TestCoordinatedSignFlipAfterQuarantine(t *testing.T) {
	const n = 16384
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	for seed := uint64(1); seed <= 5; seed++ {
		deltas, g := attackedCohort(n, seed, flipAttack)
		for _, ref := range [][]float32{g} {
			v, err := ScreenWith(deltas, ref, convergedHistory(), cfg, 2)
			if err != nil {
				t.Fatal(err)
			}
			for j := range v {
				want := Reason("")
				if j >= 6 {
					want = ReasonLowCosine
				}
				if v[j].Reason != want {
					t.Errorf("seed %d, delta %d: %q, want %q (%+v)", seed, j, v[j].Reason, want, v[j])
				}
			}
		}
	}
}

// TestNoiseAtHonestNormIsRejected: three of nine send Gaussian noise at their honest
// update's norm. With the default bar (min_cosine 0) an independent noise vector has a
// cosine of ±1/√n to anything and passed half the time (the digits process row merged 29
// of 34); the noise bar rejects it, in the first rounds and once the history is warm.
func TestNoiseAtHonestNormIsRejected(t *testing.T) {
	const n = 16384
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	for seed := uint64(1); seed <= 5; seed++ {
		deltas, g := attackedCohort(n, seed, noiseAttack)
		for _, hist := range []History{{}, {Rounds: 2, Norm: 1, Cohort: Moments{N: 2, Mean: 0.8, Var: 0.001}}, convergedHistory()} {
			// The first rounds against the others (the round's median cosine clears twice the
			// noise bar), a warm history against the momentum too.
			var ref []float32
			if hist.Rounds >= HistoryWarmup {
				ref = g
			}
			v, err := ScreenWith(deltas, ref, hist, cfg, 2)
			if err != nil {
				t.Fatal(err)
			}
			for j := range v {
				want := Reason("")
				if j >= 6 {
					want = ReasonLowCosine
				}
				if v[j].Reason != want {
					t.Errorf("seed %d, history %+v, delta %d: %q, want %q (%+v)", seed, hist, j, v[j].Reason, want, v[j])
				}
			}
		}
	}
}

// TestLoneSignFlipConverged: a lone update (an epoch's tail) is held to the momentum; the
// honest updates' cosines to it clear the noise bar by far, so the bar is raised to it and
// rejects the flip and noise while the honest update passes.
func TestLoneSignFlipConverged(t *testing.T) {
	const n = 16384
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	deltas, g := attackedCohort(n, 9, func(_ *rand.Rand, d []float32) []float32 { return d })
	hist := convergedHistory()
	for _, tc := range []struct {
		name  string
		delta []float32
		want  Reason
	}{
		{"honest", deltas[0], ""},
		{"sign flip", scaled(deltas[1], -1), ReasonLowCosine},
		{"noise", noiseAttack(rand.New(rand.NewPCG(9, 9)), deltas[2]), ReasonLowCosine},
	} {
		v, err := ScreenWith([][]float32{tc.delta}, g, hist, cfg, 1)
		if err != nil {
			t.Fatal(err)
		}
		if v[0].Reason != tc.want {
			t.Errorf("%s: %q, want %q (%+v)", tc.name, v[0].Reason, tc.want, v[0])
		}
	}
}

// TestLoneUpdateOfTheOnlyTrainer: a swarm of one trainer (one node's run, charlm at outer
// lr 1) made honest updates that pointed back along the last steps, −0.05 to −0.06 to the
// momentum against a floor of 0.007, on every retry on their base: the run stalled. A
// delta of the only peer the recent chain merged (SetSole) is not held to the momentum in
// a round of one or two; any other lone delta still is (an epoch's tail in a swarm rejects
// a lone sign flip, TestLoneSignFlipConverged), and in a cohort the flag changes nothing.
func TestLoneUpdateOfTheOnlyTrainer(t *testing.T) {
	const n = 16384
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	deltas, g := attackedCohort(n, 11, flipAttack)
	back := scaled(deltas[0], -1) // an honest update pointing back along the momentum
	hist := convergedHistory()
	screen := func(ds [][]float32, sole []bool) []Verdict {
		t.Helper()
		s, err := NewScreening(cfg, hist, len(ds), n, true, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SetSole(sole); err != nil {
			t.Fatal(err)
		}
		if err := s.AddNorms(0, ds); err != nil {
			t.Fatal(err)
		}
		if err := s.AddCosines(0, ds, g); err != nil {
			t.Fatal(err)
		}
		v, err := s.Verdicts()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name   string
		deltas [][]float32
		sole   []bool
		want   []Reason
	}{
		{"lone, pointing back, others merged recently", [][]float32{back}, []bool{false}, []Reason{ReasonLowCosine}},
		{"lone, pointing back, the only trainer", [][]float32{back}, []bool{true}, []Reason{""}},
		{"lone, the only trainer, no flags", [][]float32{back}, nil, []Reason{ReasonLowCosine}},
		{"pair: the only trainer's and a newcomer's flip", [][]float32{back, scaled(deltas[1], -1)}, []bool{true, false},
			[]Reason{"", ReasonLowCosine}},
		{"cohort: the flag changes nothing", deltas, []bool{false, false, false, false, false, false, true, false, false},
			[]Reason{"", "", "", "", "", "", ReasonLowCosine, ReasonLowCosine, ReasonLowCosine}},
	} {
		v := screen(tc.deltas, tc.sole)
		for j, want := range tc.want {
			if v[j].Reason != want {
				t.Errorf("%s, delta %d: %q, want %q (%+v)", tc.name, j, v[j].Reason, want, v[j])
			}
		}
	}
}

// TestHonestConvergedUpdatesKept: six honest trainers over 300 rounds of a converging run
// (pairwise cosines about 0.1 and about 0.01) lose under 2 % of their updates to
// screening with the noise bar.
func TestHonestConvergedUpdatesKept(t *testing.T) {
	const rounds, k, n = 300, 6, 16384
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	for _, signal := range []float64{1.0 / 3, 0.1, 0.05} {
		_, _, rej, total := honestRounds(t, cfg, rounds, k, n, signal, 1, 5)
		t.Logf("signal %.2f: %d of %d honest updates rejected", signal, rej, total)
		if rej*50 > total {
			t.Errorf("signal %.2f: %d of %d honest updates rejected (want < 2 %%)", signal, rej, total)
		}
	}
}

// TestProbationAfterTheEarlyFall: the digits process rows merged noise and sign flips at
// round 11, when three attackers came back from quarantine: honest cohort cosines had
// fallen from 0.8 at round 2 to 0.2 at round 10 (round 9's lowest 0.04), and the
// calibrated bar with them, to −0.45. Honest cosines then vary too much from round to
// round for any floor test to hold the floor without rejecting honest updates, so peers
// the chain has not merged recently are held to the floor instead. Here the history is
// folded from ten such honest rounds (each trainer's share of a common direction differs,
// the share falls round by round, and the direction turns, so the momentum agrees less
// than the others do), then three of nine attack:
//   - the calibrated bar is far below zero, and attackers it trusts are merged (the case
//     probation does not cover: a peer that earned trust first);
//   - on probation, noise and flips are rejected and the six honest updates pass;
//   - six honest updates on probation (the whole cohort) pass too.
func TestProbationAfterTheEarlyFall(t *testing.T) {
	const n, k = 16384, 6
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	share := []float32{0.6, 0.8, 0.9, 1.1, 1.2, 1.4}
	cohort := func(rng *rand.Rand, dir []float32, s float64, k int) [][]float32 {
		out := make([][]float32, k)
		for j := range out {
			d := make([]float32, n)
			for i := range d {
				d[i] = float32(s)*share[j%len(share)]*dir[i] + float32(rng.NormFloat64())
			}
			out[j] = d
		}
		return out
	}
	for seed := uint64(1); seed <= 5; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		dir := gauss(rng, n, 1)
		var hist History
		var ref []float32
		s := 0.0
		for r := range 11 {
			// The common part's scale s: pairwise cosines from 0.8 down to about 0.1, most
			// of the fall in the first rounds.
			rho := 0.1 + 0.7*math.Pow(0.6, float64(r))
			s = math.Sqrt(rho / (1 - rho))
			turn := gauss(rng, n, 1)
			for i := range dir {
				dir[i] = 0.8*dir[i] + 0.6*turn[i]
			}
			if r == 10 {
				break
			}
			deltas := cohort(rng, dir, s, k)
			v, err := ScreenWith(deltas, ref, hist, cfg, 2)
			if err != nil {
				t.Fatal(err)
			}
			for j := range v {
				if !v[j].Accepted {
					t.Fatalf("seed %d, round %d: honest delta %d rejected: %+v", seed, r, j, v[j])
				}
			}
			hist = hist.Next(v)
			ref = make([]float32, n)
			if err := WeightedMean(ref, deltas, []float64{1, 1, 1, 1, 1, 1}, 1); err != nil {
				t.Fatal(err)
			}
		}
		onProbation := func(ks ...int) []bool {
			p := make([]bool, 9)
			for _, k := range ks {
				p[k] = true
			}
			return p
		}
		for _, tc := range []struct {
			name      string
			attack    func(*rand.Rand, []float32) []float32
			probation []bool
			merged    bool // the attackers' deltas are merged
		}{
			{"noise, trusted", noiseAttack, nil, true},
			{"sign flip, trusted", flipAttack, nil, true},
			{"noise, on probation", noiseAttack, onProbation(6, 7, 8), false},
			{"sign flip, on probation", flipAttack, onProbation(6, 7, 8), false},
			{"noise, everyone on probation", noiseAttack, onProbation(0, 1, 2, 3, 4, 5, 6, 7, 8), false},
		} {
			deltas := cohort(rng, dir, s, 9)
			for j := 6; j < 9; j++ {
				deltas[j] = tc.attack(rng, deltas[j])
			}
			v, err := ScreenOnProbation(deltas, ref, hist, tc.probation, cfg, 2)
			if err != nil {
				t.Fatal(err)
			}
			for j := range v {
				want := !tc.merged && j >= 6
				if (v[j].Reason == ReasonLowCosine) != want || (!want && !v[j].Accepted) {
					t.Errorf("seed %d, %s, delta %d: %q (%+v), history %+v", seed, tc.name, j, v[j].Reason, v[j], hist.Cohort)
				}
			}
		}
		// An epoch's tail: one update, held to the momentum alone.
		honest := cohort(rng, dir, s, 1)[0]
		for _, tc := range []struct {
			name      string
			delta     []float32
			probation bool
			want      Reason
		}{
			{"lone honest, on probation", honest, true, ""},
			{"lone sign flip, on probation", scaled(honest, -1), true, ReasonLowCosine},
			{"lone noise, on probation", noiseAttack(rng, honest), true, ReasonLowCosine},
		} {
			v, err := ScreenOnProbation([][]float32{tc.delta}, ref, hist, []bool{tc.probation}, cfg, 1)
			if err != nil {
				t.Fatal(err)
			}
			if v[0].Reason != tc.want {
				t.Errorf("seed %d, %s: %q, want %q (%+v), history %+v", seed, tc.name, v[0].Reason, tc.want, v[0], hist.Ref)
			}
		}
	}
}

// TestSetProbationErrors: one flag per delta, set before the cosine pass completes.
func TestSetProbationErrors(t *testing.T) {
	cfg := ScreenConfig{MinCosine: new(0.0)}
	s, err := NewScreening(cfg, History{}, 3, 4, false, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetProbation([]bool{true}); !errors.Is(err, ErrLengthMismatch) {
		t.Errorf("1 flag for 3 deltas: %v, want ErrLengthMismatch", err)
	}
	if _, err := ScreenOnProbation([][]float32{{1, 0}, {1, 0}}, nil, History{}, []bool{true, false, true}, cfg, 1); !errors.Is(err, ErrLengthMismatch) {
		t.Errorf("3 flags for 2 deltas: %v, want ErrLengthMismatch", err)
	}
	d := [][]float32{{1, 0, 0, 0}, {1, 0.1, 0, 0}, {1, 0, 0.1, 0}}
	if err := s.AddNorms(0, d); err != nil {
		t.Fatal(err)
	}
	if err := s.AddCosines(0, d, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.SetProbation([]bool{true, true, true}); !errors.Is(err, ErrBadOption) {
		t.Errorf("after the cosine pass: %v, want ErrBadOption", err)
	}
	if err := s.SetSole([]bool{true, true, true}); !errors.Is(err, ErrBadOption) {
		t.Errorf("sole after the cosine pass: %v, want ErrBadOption", err)
	}
	s, err = NewScreening(cfg, History{}, 3, 4, false, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetSole([]bool{true}); !errors.Is(err, ErrLengthMismatch) {
		t.Errorf("sole: 1 flag for 3 deltas: %v, want ErrLengthMismatch", err)
	}
}

// TestProbationStandsAsideWhereHonestUpdatesLookLikeNoise: once converged, digits with nine
// trainers merged updates whose cosines to the others were negative round after round
// (each round's lowest −0.16 to −0.43 from round 49 on); an honest newcomer's cosine is no
// better, so a floor would reject it at every attempt and it could never earn trust. With
// the round's median cosine below twice the floor, probation changes nothing: the same
// verdicts with and without it.
func TestProbationStandsAsideWhereHonestUpdatesLookLikeNoise(t *testing.T) {
	const n = 16384
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	hist := History{Rounds: 60, Norm: 128, Cohort: Moments{N: 60, Mean: -0.2, Var: 0.03}, Ref: Moments{N: 59, Mean: 0.0, Var: 0.04}}
	for seed := uint64(1); seed <= 5; seed++ {
		rng := rand.New(rand.NewPCG(seed, 21))
		deltas := noisyCohort(rng, make([]float32, n), 9, 1) // independent: cosines about 0
		ref := gauss(rng, n, 1)
		everyone := []bool{true, true, true, true, true, true, true, true, true}
		without, err := ScreenOnProbation(deltas, ref, hist, nil, cfg, 2)
		if err != nil {
			t.Fatal(err)
		}
		with, err := ScreenOnProbation(deltas, ref, hist, everyone, cfg, 2)
		if err != nil {
			t.Fatal(err)
		}
		for j := range with {
			if !with[j].Accepted || with[j] != without[j] {
				t.Errorf("seed %d, delta %d: on probation %+v, trusted %+v", seed, j, with[j], without[j])
			}
		}
		lone, err := ScreenOnProbation(deltas[:1], ref, hist, everyone[:1], cfg, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !lone[0].Accepted {
			t.Errorf("seed %d: a lone newcomer rejected: %+v", seed, lone[0])
		}
	}
}

// TestProbationHoldsACohortToTheMomentumToo: a delta that agrees with the others (its
// cohort cosine clears the floor) but points against the momentum (the digits process row
// at round 11: a flip merged at 0.02 to the others and −0.29 to the momentum, where three
// flips agreed with each other and honest updates agreed weakly) passes a calibrated bar
// that has fallen far below zero when trusted, and is rejected on probation.
func TestProbationHoldsACohortToTheMomentumToo(t *testing.T) {
	const n = 16384
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	hist := History{Rounds: 10, Norm: 128, Cohort: Moments{N: 10, Mean: 0.4, Var: 0.06}, Ref: Moments{N: 9, Mean: 0.3, Var: 0.08}}
	for seed := uint64(1); seed <= 5; seed++ {
		rng := rand.New(rand.NewPCG(seed, 31))
		g, r := gauss(rng, n, 1), gauss(rng, n, 0.3)
		deltas := make([][]float32, 7)
		for j := range deltas {
			w := float32(1) // honest: along the others and the momentum
			if j == 6 {
				w = -1.5 // along the others, against the momentum
			}
			d := make([]float32, n)
			for i := range d {
				d[i] = g[i] + w*r[i] + float32(rng.NormFloat64())
			}
			deltas[j] = d
		}
		for _, tc := range []struct {
			name      string
			probation []bool
			want      Reason
		}{
			{"trusted", nil, ReasonNone},
			{"on probation", []bool{false, false, false, false, false, false, true}, ReasonLowCosine},
		} {
			v, err := ScreenOnProbation(deltas, r, hist, tc.probation, cfg, 2)
			if err != nil {
				t.Fatal(err)
			}
			for j := range v {
				want := ReasonNone
				if j == 6 {
					want = tc.want
				}
				if v[j].Reason != want {
					t.Errorf("seed %d, %s, delta %d: %q, want %q (%+v)", seed, tc.name, j, v[j].Reason, want, v[j])
				}
			}
		}
	}
}

// TestLoneUpdateAfterAYoungTightHistory: CI's TestLateJoinerCatchesUp stalled at round 8.
// A lone digits trainer's first six cosines to the momentum lay between −0.101 and −0.035;
// the bar calibrated from them was −0.152, its seventh update's cosine was −0.205, and
// every retry on that base failed the same way. A young history's spread is pulled toward
// PriorSpread, so that update passes, while an update against the momentum is still
// rejected.
func TestLoneUpdateAfterAYoungTightHistory(t *testing.T) {
	const n = 26122 // the digits model
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	var ref Moments
	for _, c := range []float64{-0.035, -0.058, -0.057, -0.057, -0.101, -0.052} {
		ref = ref.fold([]float64{c})
	}
	hist := History{Rounds: ref.N, Norm: 1.8, Ref: ref}
	rng := rand.New(rand.NewPCG(8, 8))
	momentum := gauss(rng, n, 0.01)
	for _, tc := range []struct {
		name   string
		cosine float64
		want   Reason
	}{
		{"typical", -0.06, ""},
		{"round 8 in CI", -0.205, ""},
		{"along the momentum", 0.3, ""},
		{"against the momentum", -0.9, ReasonLowCosine},
		{"the momentum reversed", -1, ReasonLowCosine},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := withCosine(rng, momentum, tc.cosine, 1.8)
			v, err := ScreenWith([][]float32{d}, momentum, hist, cfg, 1)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(v[0].RefCosine-tc.cosine) > 0.01 {
				t.Fatalf("built a delta at cosine %.3f, want %.3f", v[0].RefCosine, tc.cosine)
			}
			if v[0].Reason != tc.want {
				t.Errorf("cosine %.3f, bar %.3f: %q, want %q (history %+v)", v[0].RefCosine, v[0].Bar, v[0].Reason, tc.want, hist)
			}
		})
	}
}

// withCosine returns a delta of norm norm whose cosine to ref is c.
func withCosine(rng *rand.Rand, ref []float32, c, norm float64) []float32 {
	o := gauss(rng, len(ref), 1)
	rr, ro := 0.0, 0.0
	for i := range ref {
		rr += float64(ref[i]) * float64(ref[i])
		ro += float64(ref[i]) * float64(o[i])
	}
	oo := 0.0
	for i := range o {
		o[i] -= float32(ro / rr * float64(ref[i]))
		oo += float64(o[i]) * float64(o[i])
	}
	a, b := c*norm/math.Sqrt(rr), math.Sqrt(1-c*c)*norm/math.Sqrt(oo)
	d := make([]float32, len(ref))
	for i := range d {
		d[i] = float32(a*float64(ref[i]) + b*float64(o[i]))
	}
	return d
}

// TestLoneUpdateAfterTheCosinesFell: a lone digits node (outer lr 1, no momentum) merged
// updates at cosines near 0.5 to the momentum for seven rounds; from round 8 its updates
// came in at 0.08–0.17, the calibrated bar was 0.208, and 14 retries on that base were
// rejected. A round of one or two updates is held to the floor at most: such an update
// passes, while a sign flip of it and noise are rejected.
func TestLoneUpdateAfterTheCosinesFell(t *testing.T) {
	const n = 9610 // the digits model with 128 hidden units
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	var ref Moments
	for _, c := range []float64{0.55, 0.5, 0.47, 0.5, 0.45, 0.46, 0.43} {
		ref = ref.fold([]float64{c})
	}
	hist := History{Rounds: ref.N, Norm: 0.68, Ref: ref}
	rng := rand.New(rand.NewPCG(9, 9))
	momentum := gauss(rng, n, 0.01)
	honest := withCosine(rng, momentum, 0.12, 0.68)
	for _, tc := range []struct {
		name   string
		deltas [][]float32
		want   []Reason
	}{
		{"lone, at 0.12", [][]float32{honest}, []Reason{""}},
		{"lone, at 0.08", [][]float32{withCosine(rng, momentum, 0.08, 0.68)}, []Reason{""}},
		{"lone sign flip", [][]float32{scaled(honest, -1)}, []Reason{ReasonLowCosine}},
		{"lone noise", [][]float32{gauss(rng, n, 0.68/math.Sqrt(n))}, []Reason{ReasonLowCosine}},
		{"a pair, one flipped", [][]float32{withCosine(rng, momentum, 0.15, 0.68), scaled(honest, -1)}, []Reason{"", ReasonLowCosine}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := ScreenWith(tc.deltas, momentum, hist, cfg, 1)
			if err != nil {
				t.Fatal(err)
			}
			for j, want := range tc.want {
				if v[j].Reason != want {
					t.Errorf("delta %d at cosine %.3f, bar %.3f: %q, want %q (history %+v)", j, v[j].RefCosine, v[j].Bar, v[j].Reason, want, hist)
				}
			}
		})
	}
}

// TestCohortAfterTheCosinesFell: the cohort's analogue of TestLoneUpdateAfterTheCosinesFell.
// The history says updates point along the momentum at about 0.48; this round's nine honest
// updates come in at about 0.12 (and agree with each other at about 0.4). The calibrated bar
// to the momentum (0.19) would reject all nine on every retry on this base; capped at half
// this round's median, it passes them and still rejects sign flips and noise.
func TestCohortAfterTheCosinesFell(t *testing.T) {
	const n = 9610
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	var ref, coh Moments
	for _, c := range []float64{0.55, 0.5, 0.47, 0.5, 0.45, 0.46, 0.43} {
		ref = ref.fold([]float64{c})
		coh = coh.fold([]float64{c - 0.05, c, c + 0.05})
	}
	hist := History{Rounds: ref.N, Norm: 0.68, Cohort: coh, Ref: ref}
	rng := rand.New(rand.NewPCG(10, 10))
	momentum := gauss(rng, n, 0.01)
	shared := withCosine(rng, momentum, 0.25, 1)
	honest := func() []float32 { return withCosine(rng, shared, 0.5, 0.68) }
	cohort := func(attack func([]float32) []float32) [][]float32 {
		out := make([][]float32, 9)
		for j := range out {
			out[j] = honest()
			if j >= 6 && attack != nil {
				out[j] = attack(out[j])
			}
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		deltas [][]float32
		odd    int // the last odd deltas must be rejected, the others accepted
	}{
		{"nine honest", cohort(nil), 0},
		{"three sign flips", cohort(func(d []float32) []float32 { return scaled(d, -1) }), 3},
		{"three noise", cohort(func(d []float32) []float32 { return gauss(rng, n, 0.68/math.Sqrt(n)) }), 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := ScreenWith(tc.deltas, momentum, hist, cfg, 1)
			if err != nil {
				t.Fatal(err)
			}
			for j := range v {
				want := Reason("")
				if j >= len(v)-tc.odd {
					want = ReasonLowCosine
				}
				if v[j].Reason != want {
					t.Errorf("delta %d: cosine %.3f, to momentum %.3f, bar %.3f: %q, want %q", j, v[j].Cosine, v[j].RefCosine, v[j].Bar, v[j].Reason, want)
				}
			}
		})
	}
}

// TestProbationAgainstTheReferenceWantsAPositiveCosine: converged, honest windows point
// along the validator's own window only a little (cosine about +0.1), the calibrated bar
// has fallen far below zero and the floor stands aside (the history's mean cosine, 0.05,
// is below twice the noise bar). A sign flip of an honest update (about −0.1) and noise at
// an honest norm (about 0 ± 0.008) then pass from a peer the chain trusts, but not from one
// on probation, held to half the history's mean (0.025): half the swarm attacking from
// fresh peer ids can no longer earn its way in through such rounds. An honest newcomer
// passes.
func TestProbationAgainstTheReferenceWantsAPositiveCosine(t *testing.T) {
	const n = 16384
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	hist := History{Rounds: 20, Norm: 128, Ref: Moments{N: 20, Mean: 0.05, Var: 0.04}}
	for seed := uint64(1); seed <= 5; seed++ {
		rng := rand.New(rand.NewPCG(seed, 41))
		ref := gauss(rng, n, 1)
		deltas := make([][]float32, 8)
		for j := range deltas {
			d := gauss(rng, n, 1)
			switch {
			case j < 4:
				for i := range d {
					d[i] += 0.1 * ref[i] // cosine to ref about 0.1
				}
			case j < 6:
				d = scaled(deltas[j-4], -1) // the flip of an honest update
			}
			deltas[j] = d // 6 and 7: noise
		}
		for _, tc := range []struct {
			name      string
			probation []bool
			want      []Reason
		}{
			{"nobody on probation", nil, []Reason{ReasonNone, ReasonNone, ReasonNone, ReasonNone, ReasonNone, ReasonNone, ReasonNone, ReasonNone}},
			{"flippers on probation", []bool{false, false, false, false, true, true, true, true},
				[]Reason{ReasonNone, ReasonNone, ReasonNone, ReasonNone, ReasonLowCosine, ReasonLowCosine, ReasonLowCosine, ReasonLowCosine}},
			{"everyone on probation", []bool{true, true, true, true, true, true, true, true},
				[]Reason{ReasonNone, ReasonNone, ReasonNone, ReasonNone, ReasonLowCosine, ReasonLowCosine, ReasonLowCosine, ReasonLowCosine}},
		} {
			v, err := ScreenTrusted(deltas, ref, hist, tc.probation, cfg, 2)
			if err != nil {
				t.Fatal(err)
			}
			for j := range v {
				if v[j].Reason != tc.want[j] {
					t.Errorf("seed %d, %s, delta %d: %q, want %q (%+v)", seed, tc.name, j, v[j].Reason, tc.want[j], v[j])
				}
			}
		}
	}
}
