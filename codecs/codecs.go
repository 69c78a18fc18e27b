// Package codecs names the wire encodings of a pseudo-gradient: the values protocol.codec
// accepts and a delta file's metadata stores. The names live apart from the math (diloco
// encodes and decodes them) so that config can check and default them from below diloco.
// Imports nothing of ours.
package codecs

import (
	"errors"
	"fmt"
	"strings"
)

// Codec names a wire encoding of a pseudo-gradient; the values are the strings stored in
// the delta file's metadata and in configs.
type Codec string

const (
	// FP32 stores each value as a little-endian IEEE float32: exact.
	FP32 Codec = "fp32"
	// FP16 stores each value as a little-endian IEEE half, rounded to nearest even;
	// magnitudes beyond the half range saturate to ±65504 instead of becoming ±Inf.
	FP16 Codec = "fp16"
	// Int8 stores one int8 per value plus one float32 scale per block of values:
	// value = q·scale.
	Int8 Codec = "int8"
	// Sparse keeps, per block, the top-k values by magnitude at 2 bits each (sign and one
	// of two per-block scales) with Elias–Fano positions; the rest is left to error
	// feedback. See diloco/sparse.go and docs/formats.md.
	Sparse Codec = "sparse"
)

// ErrUnknown: a codec name is not one of the Codec constants.
var ErrUnknown = errors.New("unknown codec")

// All returns every Codec, for help texts and config validation.
func All() []Codec { return []Codec{FP32, FP16, Int8, Sparse} }

// List spells All() for messages and help texts: "fp32, fp16, int8 or sparse".
func List() string {
	cs := All()
	var b strings.Builder
	for i, c := range cs {
		switch {
		case i == 0:
		case i == len(cs)-1:
			b.WriteString(" or ")
		default:
			b.WriteString(", ")
		}
		b.WriteString(string(c))
	}
	return b.String()
}

// Parse returns the Codec spelled s, or an error wrapping ErrUnknown.
func Parse(s string) (Codec, error) {
	for _, c := range All() {
		if string(c) == s {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w %q (want one of %v)", ErrUnknown, s, All())
}
