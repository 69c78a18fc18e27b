package diloco

import (
	"github.com/p2pnode/p2pnode/internal/parallel"

	"encoding/binary"
	"fmt"
	"math"
)

// Decode writes the N values of e into dst, which must have length e.N. e is validated
// first (see Encoded.Validate), so a malformed encoding from a peer yields an error, never
// a panic or an out-of-range read. int8 values decode as q·scale in float32; a byte of
// −128, which Encode never writes, decodes as −128·scale. Decoded values are not checked:
// fp16/fp32 data may hold NaN or ±Inf and a scale near the float32 maximum can overflow
// q·scale — merge.Screen rejects such deltas. A sparse encoding decodes as ±scale at its
// positions and +0 elsewhere; its positions are checked (strictly increasing, in range, one
// canonical bit pattern) before dst is written. On error dst is untouched.
func Decode(e Encoded, dst []float32, workers int) error {
	if err := e.Validate(); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if len(dst) != e.N {
		return fmt.Errorf("decode: %w: dst has %d elements, encoding has %d", ErrLengthMismatch, len(dst), e.N)
	}
	switch e.Codec {
	case Sparse:
		if err := decodeSparse(e, dst, 0, layoutOf(e.N, e.BlockSize, e.TopK).blocks, workers); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
	case FP32:
		parallel.ForChunks(e.N, parallel.ChunkLen, workers, func(_, lo, hi int) {
			in := e.Data[4*lo : 4*hi]
			for i := range dst[lo:hi] {
				dst[lo+i] = math.Float32frombits(binary.LittleEndian.Uint32(in[4*i:]))
			}
		})
	case FP16:
		parallel.ForChunks(e.N, parallel.ChunkLen, workers, func(_, lo, hi int) {
			in := e.Data[2*lo : 2*hi]
			for i := range dst[lo:hi] {
				dst[lo+i] = fromHalf(binary.LittleEndian.Uint16(in[2*i:]))
			}
		})
	case Int8:
		B := e.BlockSize
		parallel.ForChunks(e.N, int8ChunkLen(B), workers, func(_, lo, hi int) {
			for b := lo; b < hi; b += B {
				end := min(b+B, hi)
				scale := e.Scales[b/B]
				out, in := dst[b:end], e.Data[b:end]
				in = in[:len(out)]
				for i := range out {
					out[i] = dequantize(int8(in[i]), scale)
				}
			}
		})
	}
	return nil
}
