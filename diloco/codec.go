package diloco

import (
	"github.com/p2pnode/p2pnode/internal/parallel"

	"fmt"
	"math"
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
	// Int8 stores one int8 per value plus one float32 scale per block of BlockSize
	// values: value = q·scale.
	Int8 Codec = "int8"
	// Sparse keeps, per block, the top-k values by magnitude at 2 bits each (sign and one
	// of two per-block scales) with Elias–Fano positions; the rest is left to error
	// feedback. See sparse.go and docs/formats.md.
	Sparse Codec = "sparse"
)

// DefaultBlockSize is the int8 block length used when Encode is given 0.
const DefaultBlockSize = 256

// Codecs returns every Codec, for help texts and config validation.
func Codecs() []Codec { return []Codec{FP32, FP16, Int8, Sparse} }

// CodecList spells Codecs() for messages and help texts: "fp32, fp16, int8 or sparse".
func CodecList() string {
	cs := Codecs()
	out := ""
	for i, c := range cs {
		switch {
		case i == 0:
		case i == len(cs)-1:
			out += " or "
		default:
			out += ", "
		}
		out += string(c)
	}
	return out
}

// ParseCodec returns the Codec spelled s, or an error wrapping ErrUnknownCodec.
func ParseCodec(s string) (Codec, error) {
	for _, c := range Codecs() {
		if string(c) == s {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w %q (want one of %v)", ErrUnknownCodec, s, Codecs())
}

// elemSize is the number of data bytes per value, 0 for an unknown codec.
func (c Codec) elemSize() int {
	switch c {
	case FP32:
		return 4
	case FP16:
		return 2
	case Int8:
		return 1
	}
	return 0
}

// Encoded is an encoded pseudo-gradient of N values. Data holds the values little-endian
// (float32, half or int8 by Codec); Scales holds one float32 per block of BlockSize values
// for Int8 and is empty otherwise, as BlockSize is 0 for the float codecs. The pack layer
// maps Data and Scales to the `delta` and `scales` tensors of docs/formats.md.
//
// For Sparse, Data holds the 2-bit values, Scales two float32 (lo, hi) per block, Index
// the Elias–Fano positions and TopK the values kept per block (sparse.go); TopK and Index
// are unused by the other codecs.
type Encoded struct {
	Codec     Codec
	N         int
	BlockSize int
	TopK      int
	Data      []byte
	Scales    []float32
	Index     []byte
}

// WireBytes is the size of the payload on the wire: data, scales and index, without the
// file header.
func (e Encoded) WireBytes() int { return len(e.Data) + 4*len(e.Scales) + len(e.Index) }

// Validate checks that e is self-consistent — a known codec, len(Data) = N·element size,
// for Int8 a positive BlockSize and len(Scales) = ceil(N/BlockSize) with every scale finite
// and ≥ 0, for the float codecs BlockSize 0 and no scales — so that Decode cannot read out
// of bounds or produce values from a corrupt scale. Data values themselves are not checked:
// a NaN in fp16/fp32 data decodes as NaN, for screening to reject.
//
// For Sparse it checks the block size, top-k, the lengths of Data, Index and Scales against
// the layout and the scales; the records themselves (positions in order and in range,
// padding) are checked as Decode reads them.
func (e Encoded) Validate() error {
	if e.Codec == Sparse {
		return e.validateSparse()
	}
	if e.TopK != 0 || len(e.Index) != 0 {
		return fmt.Errorf("encoded delta: %w: %s has top-k %d and %d index bytes, want none", ErrMalformed, e.Codec, e.TopK, len(e.Index))
	}
	size := e.Codec.elemSize()
	if size == 0 {
		return fmt.Errorf("encoded delta: %w %q", ErrUnknownCodec, e.Codec)
	}
	if e.N < 0 || e.N > math.MaxInt/size {
		return fmt.Errorf("encoded delta: %w: n = %d", ErrMalformed, e.N)
	}
	if len(e.Data) != e.N*size {
		return fmt.Errorf("encoded delta: %w: %s data is %d bytes, want %d for n = %d", ErrMalformed, e.Codec, len(e.Data), e.N*size, e.N)
	}
	if e.Codec != Int8 {
		if e.BlockSize != 0 || len(e.Scales) != 0 {
			return fmt.Errorf("encoded delta: %w: %s has block size %d and %d scales, want none", ErrMalformed, e.Codec, e.BlockSize, len(e.Scales))
		}
		return nil
	}
	if e.BlockSize <= 0 {
		return fmt.Errorf("encoded delta: %w: int8 block size %d", ErrMalformed, e.BlockSize)
	}
	if want := parallel.NumChunks(e.N, e.BlockSize); len(e.Scales) != want {
		return fmt.Errorf("encoded delta: %w: %d scales, want %d for n = %d and block size %d", ErrMalformed, len(e.Scales), want, e.N, e.BlockSize)
	}
	for b, s := range e.Scales {
		if !(s >= 0) || math.IsInf(float64(s), 0) {
			return fmt.Errorf("encoded delta: %w: scale %d is %v", ErrMalformed, b, s)
		}
	}
	return nil
}
