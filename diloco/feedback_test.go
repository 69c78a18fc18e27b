package diloco

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// Over many rounds with error feedback, the sum of what was sent (decoded int8) tracks the
// sum of the true deltas: the gap is exactly the current residual, which stays within half
// a quantisation step. Without feedback the gap grows every round.
//
// The deltas are built so that plain int8 loses information systematically: each block
// has one large value (±100) that sets the scale (≈0.79), and the other values carry a
// steady drift of 0.3 — below half a step, so without feedback they always encode as 0.
func TestErrorFeedbackTracksTrueSum(t *testing.T) {
	const (
		n      = 4096
		block  = 256
		rounds = 200
	)
	rng := rand.New(rand.NewPCG(7, 7))
	trueSum := make([]float64, n)
	sentEF := make([]float64, n)
	sentPlain := make([]float64, n)
	residual := make([]float32, n)
	delta := make([]float32, n)
	dec := make([]float32, n)
	for range rounds {
		for i := range delta {
			if i%block == 0 {
				delta[i] = float32(100 * math.Copysign(1, rng.NormFloat64()))
			} else {
				delta[i] = float32(0.3 + 0.05*rng.NormFloat64())
			}
			trueSum[i] += float64(delta[i])
		}
		e, err := Encode(Int8, delta, residual, block, 2)
		if err != nil {
			t.Fatal(err)
		}
		if err := Decode(e, dec, 2); err != nil {
			t.Fatal(err)
		}
		for i, v := range dec {
			sentEF[i] += float64(v)
		}
		e, err = Encode(Int8, delta, nil, block, 2)
		if err != nil {
			t.Fatal(err)
		}
		if err := Decode(e, dec, 2); err != nil {
			t.Fatal(err)
		}
		for i, v := range dec {
			sentPlain[i] += float64(v)
		}
	}
	halfStep := 100.0 / 127 / 2
	var worstEF, worstPlain, worstIdentity float64
	for i := range trueSum {
		gap := trueSum[i] - sentEF[i]
		worstEF = max(worstEF, math.Abs(gap))
		worstPlain = max(worstPlain, math.Abs(trueSum[i]-sentPlain[i]))
		// The gap is the residual, up to float32 rounding of x = delta + residual.
		worstIdentity = max(worstIdentity, math.Abs(gap-float64(residual[i])))
		if r := math.Abs(float64(residual[i])); r > halfStep*1.001 {
			t.Fatalf("element %d: residual %v exceeds half a step %v", i, r, halfStep)
		}
	}
	t.Logf("after %d rounds: max |true − sent| = %.4f with feedback, %.1f without", rounds, worstEF, worstPlain)
	if worstEF > halfStep*1.01 {
		t.Errorf("with feedback the gap reached %v, want ≤ half a step (%v)", worstEF, halfStep)
	}
	if worstIdentity > 1e-3 {
		t.Errorf("gap and residual differ by %v", worstIdentity)
	}
	if worstPlain < 10 {
		t.Errorf("without feedback the gap is only %v: the test no longer exercises drift", worstPlain)
	}
}

// EncodeSparse adds the residual times decay to the delta: x = Δ + β·r. Here Δ = 0, block 4
// and top-1, so x = β·r, the largest |x| is sent and the rest stays in the residual. A decay
// outside (0, 1] is refused, and the residual is left unchanged.
func TestEncodeSparseDecay(t *testing.T) {
	b := func(v float64) float32 { return float32(v) }
	for _, tc := range []struct {
		name         string
		decay        float64
		sent         float32   // the one value decoded, at position 1
		wantResidual []float32 // nil: refused
	}{
		{"plain error feedback", 1, -4, []float32{2, 0, 0, 1e-3}},
		{"half", 0.5, -2, []float32{1, 0, 0, 5e-4}},
		{"SparseLoCo's", 0.95, -4 * b(0.95), []float32{2 * b(0.95), 0, 0, float32(b(0.95) * 1e-3)}},
		{"zero", 0, 0, nil},
		{"negative", -0.5, 0, nil},
		{"above one", 1.5, 0, nil},
		{"NaN", math.NaN(), 0, nil},
		{"below float32", 1e-50, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := []float32{2, -4, 0, 1e-3}
			e, err := EncodeSparse(make([]float32, 4), r, 4, 1, tc.decay, 2)
			if tc.wantResidual == nil {
				if !errors.Is(err, ErrBadConfig) {
					t.Fatalf("decay %v: err %v, want ErrBadConfig", tc.decay, err)
				}
				if want := []float32{2, -4, 0, 1e-3}; !slices.Equal(r, want) {
					t.Fatalf("decay %v refused, but the residual became %v (want %v)", tc.decay, r, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			dec := make([]float32, 4)
			if err := Decode(e, dec, 1); err != nil {
				t.Fatal(err)
			}
			if want := []float32{0, tc.sent, 0, 0}; !slices.Equal(dec, want) {
				t.Errorf("decay %v: decoded %v, want %v", tc.decay, dec, want)
			}
			if !slices.Equal(r, tc.wantResidual) {
				t.Errorf("decay %v: residual %v, want %v", tc.decay, r, tc.wantResidual)
			}
		})
	}
}
