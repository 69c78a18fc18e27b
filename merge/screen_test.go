package merge

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// cohort returns nHonest deltas that share a direction plus noise, as honest trainers'
// pseudo-gradients would.
func cohort(seed uint64, nHonest, n int) [][]float32 {
	rng := rand.New(rand.NewPCG(seed, 2))
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(rng.NormFloat64())
	}
	out := make([][]float32, nHonest)
	for k := range out {
		d := make([]float32, n)
		for i := range d {
			d[i] = g[i] + float32(0.3*rng.NormFloat64())
		}
		out[k] = d
	}
	return out
}

func scaled(x []float32, s float32) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = s * v
	}
	return out
}

func withValue(x []float32, i int, v float32) []float32 {
	out := append([]float32(nil), x...)
	out[i] = v
	return out
}

func TestScreenRejectsAttacks(t *testing.T) {
	honest := cohort(1, 6, 1000)
	attacks := []struct {
		name  string
		delta []float32
		want  Reason
	}{
		{"NaN", withValue(honest[0], 17, float32(math.NaN())), ReasonNonFinite},
		{"+Inf", withValue(honest[1], 999, float32(math.Inf(1))), ReasonNonFinite},
		{"−Inf", withValue(honest[1], 0, float32(math.Inf(-1))), ReasonNonFinite},
		{"×1000", scaled(honest[2], 1000), ReasonNormOutlier},
		{"sign flipped", scaled(honest[3], -1), ReasonLowCosine},
	}
	deltas := append([][]float32(nil), honest...)
	for _, a := range attacks {
		deltas = append(deltas, a.delta)
	}
	cfg := ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0)}
	v, err := Screen(deltas, cfg, 2)
	if err != nil {
		t.Fatal(err)
	}
	for k := range honest {
		if !v[k].Accepted || v[k].Reason != ReasonNone {
			t.Errorf("honest delta %d rejected: %+v", k, v[k])
		}
		if v[k].Cosine < 0.5 {
			t.Errorf("honest delta %d: cosine %v, want > 0.5", k, v[k].Cosine)
		}
	}
	for j, a := range attacks {
		got := v[len(honest)+j]
		if got.Accepted || got.Reason != a.want {
			t.Errorf("%s: verdict %+v, want rejected with %q", a.name, got, a.want)
		}
	}
	if c := v[len(v)-1].Cosine; c > -0.5 {
		t.Errorf("sign flipped: cosine %v, want < −0.5", c)
	}
}

func TestScreenNormBound(t *testing.T) {
	deltas := [][]float32{{3, 4}, {0.6, 0.8}, {30, 40}}
	v, err := Screen(deltas, ScreenConfig{MaxNorm: 5}, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := []Reason{ReasonNone, ReasonNone, ReasonNormBound}
	for k := range deltas {
		if v[k].Reason != want[k] || v[k].Accepted != (want[k] == ReasonNone) {
			t.Errorf("delta %d: %+v, want reason %q", k, v[k], want[k])
		}
	}
	requireBits64(t, "norm 0", v[0].Norm, 5)
	requireBits64(t, "norm 2", v[2].Norm, 50)
}

// TestScreenPair: with two deltas there is no majority to compare with, so a pair is held
// to each other: the larger is rejected when it exceeds MaxNormRatio × the smaller (the
// smaller can do little harm), and when they point apart neither can be told odd, so both
// are rejected. A lone delta is judged by the absolute checks only.
func TestScreenPair(t *testing.T) {
	cfg := ScreenConfig{MaxNormRatio: 2, MinCosine: new(0.5)}
	for _, tc := range []struct {
		name   string
		deltas [][]float32
		want   []Reason
	}{
		{"aligned", [][]float32{{1, 1}, {1.5, 1.4}}, []Reason{"", ""}},
		{"one huge", [][]float32{{1, 1}, {1000, 1000}}, []Reason{"", ReasonNormOutlier}},
		{"opposed", [][]float32{{1, 1}, {-1, -1.2}}, []Reason{ReasonLowCosine, ReasonLowCosine}},
		{"lone huge", [][]float32{{-1000, -1000}}, []Reason{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Screen(tc.deltas, cfg, 1)
			if err != nil {
				t.Fatal(err)
			}
			for k, want := range tc.want {
				if v[k].Reason != want || v[k].Accepted != (want == ReasonNone) {
					t.Errorf("delta %d: %+v, want %q", k, v[k], want)
				}
			}
		})
	}
}

func TestScreenZeroThresholdIsActive(t *testing.T) {
	// MinCosine 0 must reject a delta opposed to the rest; nil must not.
	deltas := [][]float32{{1, 0}, {1, 0.1}, {1, -0.1}, {-1, 0}}
	on, err := Screen(deltas, ScreenConfig{MinCosine: new(0.0)}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if on[3].Reason != ReasonLowCosine {
		t.Errorf("MinCosine 0: delta 3 %+v, want low_cosine", on[3])
	}
	off, err := Screen(deltas, ScreenConfig{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !off[3].Accepted {
		t.Errorf("MinCosine nil: delta 3 %+v, want accepted", off[3])
	}
}

func TestScreenOrderIndependent(t *testing.T) {
	honest := cohort(5, 5, 777)
	deltas := append(honest, scaled(honest[0], -1), scaled(honest[1], 50), withValue(honest[2], 3, float32(math.NaN())))
	cfg := ScreenConfig{MaxNormRatio: 5, MinCosine: new(0.1)}
	base, err := Screen(deltas, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	for range 10 {
		perm := rng.Perm(len(deltas))
		shuffled := make([][]float32, len(deltas))
		for to, from := range perm {
			shuffled[to] = deltas[from]
		}
		v, err := Screen(shuffled, cfg, 3)
		if err != nil {
			t.Fatal(err)
		}
		for to, from := range perm {
			got, want := v[to], base[from]
			if got.Accepted != want.Accepted || got.Reason != want.Reason {
				t.Fatalf("delta %d moved to %d: %+v, was %+v", from, to, got, want)
			}
			if math.Float64bits(got.Norm) != math.Float64bits(want.Norm) && !math.IsNaN(want.Norm) {
				t.Fatalf("delta %d: norm %v, was %v", from, got.Norm, want.Norm)
			}
			// U is summed in float32 in cohort order, so a permutation moves the cosine by
			// rounding only; the verdicts above must not move at all.
			if math.Abs(got.Cosine-want.Cosine) > 1e-6 {
				t.Fatalf("delta %d: cosine %v, was %v", from, got.Cosine, want.Cosine)
			}
		}
	}
}

func TestScreenErrors(t *testing.T) {
	ok := [][]float32{{1}, {2}}
	tests := []struct {
		name   string
		deltas [][]float32
		cfg    ScreenConfig
		want   error
	}{
		{"ragged", [][]float32{{1, 2}, {1}}, ScreenConfig{}, ErrLengthMismatch},
		{"negative max norm", ok, ScreenConfig{MaxNorm: -1}, ErrBadOption},
		{"NaN max norm", ok, ScreenConfig{MaxNorm: math.NaN()}, ErrBadOption},
		{"ratio below 1", ok, ScreenConfig{MaxNormRatio: 0.5}, ErrBadOption},
		{"cosine above 1", ok, ScreenConfig{MinCosine: new(1.5)}, ErrBadOption},
		{"NaN cosine", ok, ScreenConfig{MinCosine: new(math.NaN())}, ErrBadOption},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Screen(tc.deltas, tc.cfg, 0); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	v, err := Screen(nil, ScreenConfig{}, 0)
	if err != nil || len(v) != 0 {
		t.Fatalf("empty cohort: %v, %v", v, err)
	}
}
