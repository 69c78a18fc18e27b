package diloco

import (
	"errors"
	"math"
	"testing"
)

func TestDecayResidual(t *testing.T) {
	for _, tc := range []struct {
		name  string
		decay float64
		want  []float32 // nil: refused, the residual unchanged
	}{
		{"plain error feedback", 1, []float32{2, -4, 0, 1e-3}},
		{"half", 0.5, []float32{1, -2, 0, 5e-4}},
		{"SparseLoCo's", 0.95, []float32{2 * float32(0.95), -4 * float32(0.95), 0, 1e-3 * float32(0.95)}},
		{"zero", 0, nil},
		{"negative", -0.5, nil},
		{"above one", 1.5, nil},
		{"NaN", math.NaN(), nil},
		{"below float32", 1e-50, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := []float32{2, -4, 0, 1e-3}
			err := DecayResidual(r, tc.decay, 2)
			if tc.want == nil {
				if !errors.Is(err, ErrBadConfig) {
					t.Fatalf("decay %v: err %v, want ErrBadConfig", tc.decay, err)
				}
				tc.want = []float32{2, -4, 0, 1e-3}
			} else if err != nil {
				t.Fatal(err)
			}
			for i := range r {
				if r[i] != tc.want[i] {
					t.Fatalf("decay %v: residual %v, want %v", tc.decay, r, tc.want)
				}
			}
		})
	}
}
