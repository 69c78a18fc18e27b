package diloco

import (
	"errors"
	"testing"
)

func TestPseudoGradient(t *testing.T) {
	base := []float32{1, 0.5, -2, 0}
	local := []float32{0.75, 1, -2, negZero()}
	want := []float32{0.25, -0.5, 0, 0}
	dst := make([]float32, 4)
	if err := PseudoGradient(dst, base, local, 1); err != nil {
		t.Fatal(err)
	}
	requireBits32(t, "dst", dst, want)

	// In place over local: what a trainer does to avoid a third buffer.
	l := append([]float32(nil), local...)
	if err := PseudoGradient(l, base, l, 2); err != nil {
		t.Fatal(err)
	}
	requireBits32(t, "in place", l, want)

	if err := PseudoGradient(dst, base, local[:3], 1); !errors.Is(err, ErrLengthMismatch) {
		t.Fatalf("short local: err = %v", err)
	}
	if err := PseudoGradient(dst[:3], base, local, 1); !errors.Is(err, ErrLengthMismatch) {
		t.Fatalf("short dst: err = %v", err)
	}
}
