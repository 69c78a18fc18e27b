package diloco

import (
	"github.com/p2pnode/p2pnode/internal/parallel"

	"encoding/binary"
	"fmt"
	"math"
)

// Encode encodes delta with codec. blockSize is the int8 block length (0 = 256, negative
// is an error); the float codecs ignore it.
//
// With residual != nil (error feedback) the value encoded is x = delta + residual (a
// float32 add), and afterwards residual holds x − decode(encoded), in place: whatever the
// codec lost this round is added back next round, so over many rounds the decoded sum
// tracks the true sum within one round's quantisation error. residual starts as zeros and
// belongs to the trainer; it is left untouched when Encode fails.
//
// int8 works per block of blockSize values: scale = max|x|/127 in float32 (0 for an
// all-zero block), q = round-half-away-from-zero(x/scale) clamped to [−127, 127]. fp16
// rounds to nearest even and saturates to ±65504. Values to encode must be finite.
//
// Sparse is EncodeSparse with blockSize (0 = 4096), the default top-k ratio (1.56 %) and
// plain error feedback (decay 1).
func Encode(codec Codec, delta, residual []float32, blockSize, workers int) (Encoded, error) {
	if codec == Sparse {
		return EncodeSparse(delta, residual, blockSize, 0, 1, workers)
	}
	size := elemSize(codec)
	if size == 0 {
		return Encoded{}, fmt.Errorf("encode: %w %q", ErrUnknownCodec, codec)
	}
	if residual != nil && len(residual) != len(delta) {
		return Encoded{}, fmt.Errorf("encode: %w: %d delta and %d residual elements", ErrLengthMismatch, len(delta), len(residual))
	}
	if blockSize < 0 {
		return Encoded{}, fmt.Errorf("encode: %w: block size %d", ErrBadConfig, blockSize)
	}
	if i := firstNonFinite(delta, residual, 1, workers); i >= 0 {
		if residual != nil {
			return Encoded{}, fmt.Errorf("encode: %w: element %d is delta %v + residual %v", ErrNonFinite, i, delta[i], residual[i])
		}
		return Encoded{}, fmt.Errorf("encode: %w: element %d is %v", ErrNonFinite, i, delta[i])
	}
	e := Encoded{Codec: codec, N: len(delta), Data: make([]byte, len(delta)*size)}
	switch codec {
	case FP32:
		parallel.ForChunks(len(delta), parallel.ChunkLen, workers, func(_, lo, hi int) {
			encodeFP32(e.Data[4*lo:4*hi], delta[lo:hi], sub(residual, lo, hi))
		})
	case FP16:
		parallel.ForChunks(len(delta), parallel.ChunkLen, workers, func(_, lo, hi int) {
			encodeFP16(e.Data[2*lo:2*hi], delta[lo:hi], sub(residual, lo, hi))
		})
	case Int8:
		if blockSize == 0 {
			blockSize = DefaultBlockSize
		}
		e.BlockSize = blockSize
		e.Scales = make([]float32, parallel.NumChunks(len(delta), blockSize))
		// Chunks are whole blocks, so every block is encoded by one goroutine.
		parallel.ForChunks(len(delta), int8ChunkLen(blockSize), workers, func(_, lo, hi int) {
			for b := lo; b < hi; b += blockSize {
				end := min(b+blockSize, hi)
				e.Scales[b/blockSize] = encodeInt8Block(e.Data[b:end], delta[b:end], sub(residual, b, end))
			}
		})
	}
	return e, nil
}

// int8ChunkLen is a whole number of blocks close to parallel.ChunkLen (one block if blocks are
// larger).
func int8ChunkLen(blockSize int) int {
	return max(1, parallel.ChunkLen/blockSize) * blockSize
}

// sub returns r[lo:hi], or nil when there is no residual.
func sub(r []float32, lo, hi int) []float32 {
	if r == nil {
		return nil
	}
	return r[lo:hi]
}

// Each kernel reads x = d[i] (+ r[i]) before it overwrites r[i] with the new residual.

func encodeFP32(out []byte, d, r []float32) {
	for i, x := range d {
		if r != nil {
			x += r[i]
			r[i] = 0 // fp32 is exact: nothing is lost
		}
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
}

func encodeFP16(out []byte, d, r []float32) {
	for i, x := range d {
		if r != nil {
			x += r[i]
		}
		h := toHalf(x)
		binary.LittleEndian.PutUint16(out[2*i:], h)
		if r != nil {
			r[i] = x - fromHalf(h)
		}
	}
}

func encodeInt8Block(out []byte, d, r []float32) (scale float32) {
	var maxAbs float32
	for i, x := range d {
		if r != nil {
			x += r[i]
		}
		maxAbs = max(maxAbs, abs32(x))
	}
	scale = int8Scale(maxAbs)
	for i, x := range d {
		if r != nil {
			x += r[i]
		}
		q := quantize(x, scale)
		out[i] = byte(q)
		if r != nil {
			r[i] = x - dequantize(q, scale)
		}
	}
	return scale
}

// firstNonFinite returns the lowest i where delta[i] (+ float32(decay·residual[i])) is NaN
// or ±Inf, or −1: the value an encoder would encode. The sum can overflow even when both
// terms are finite, so it is the sum we check.
func firstNonFinite(delta, residual []float32, decay float32, workers int) int {
	found := make([]int, parallel.NumChunks(len(delta), parallel.ChunkLen))
	parallel.ForChunks(len(delta), parallel.ChunkLen, workers, func(c, lo, hi int) {
		found[c] = -1
		r := sub(residual, lo, hi)
		for i, x := range delta[lo:hi] {
			if r != nil {
				x += float32(decay * r[i])
			}
			if math.Float32bits(x)&0x7f800000 == 0x7f800000 {
				found[c] = lo + i
				return
			}
		}
	})
	for _, i := range found {
		if i >= 0 {
			return i
		}
	}
	return -1
}
