package diloco

import (
	"github.com/p2pnode/p2pnode/codecs"
	"github.com/p2pnode/p2pnode/internal/parallel"

	"fmt"
	"math"
)

// Codec names a wire encoding of a pseudo-gradient. It is codecs.Codec: the names live in
// package codecs so that config can read them without the math.
type Codec = codecs.Codec

// The codecs this package encodes and decodes (see package codecs).
const (
	FP32   = codecs.FP32
	FP16   = codecs.FP16
	Int8   = codecs.Int8
	Sparse = codecs.Sparse
)

// DefaultBlockSize is the int8 block length used when Encode is given 0.
const DefaultBlockSize = 256

// elemSize is the number of data bytes per value of c, 0 for an unknown codec.
func elemSize(c Codec) int {
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
	size := elemSize(e.Codec)
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
