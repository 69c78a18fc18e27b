package diloco

import (
	"fmt"

	"github.com/p2pnode/p2pnode/internal/parallel"
)

// Range decoding lets a validator stream a contribution from disk a block of values at a
// time instead of decoding all N values into memory: it reads only the bytes that cover the
// values it wants (Span), views them as a self-contained encoding of those values (the
// Encoded that Slice returns, or one assembled from those bytes), and decodes that. Every
// codec encodes independent units of Align values (one value for fp32/fp16, one block for
// int8 and sparse), so a range that starts on a unit boundary decodes to exactly the bits a
// full Decode gives for those values. A sparse block's record (positions anywhere in the
// block) is indivisible, so for sparse Span and Slice also need the range to end on a block
// boundary or at N; DecodeRange takes any end.

// Align is the granularity of range decoding: a range [lo, hi) may start only at a multiple
// of Align (its end is free, except for Span and Slice of sparse). 1 for the float codecs,
// BlockSize for int8 and sparse, 0 for an unknown codec or a non-positive block size.
func (e Encoded) Align() int {
	switch e.Codec {
	case FP32, FP16:
		return 1
	case Int8, Sparse:
		return max(e.BlockSize, 0)
	}
	return 0
}

// Span locates the encoded bytes of values [Lo, Hi) in an encoding's tensors: the data
// bytes Data[DataBegin:DataEnd], the scales Scales[ScaleBegin:ScaleEnd] (both 0 for the
// float codecs) and, for sparse, the index bytes Index[IndexBegin:IndexEnd]. Offsets are in
// bytes for data and index and in scale elements for scales.
type Span struct {
	Lo, Hi               int
	DataBegin, DataEnd   int
	ScaleBegin, ScaleEnd int
	IndexBegin, IndexEnd int
}

// Span returns where values [lo, hi) of e live. Only e's Codec, N, BlockSize and TopK are
// read, so a streaming reader can compute the span from a file's header before reading any
// data. lo must be a multiple of e.Align() and 0 ≤ lo ≤ hi ≤ N; for sparse hi too, or N.
func (e Encoded) Span(lo, hi int) (Span, error) {
	if e.Codec == Sparse {
		return e.sparseSpan(lo, hi)
	}
	size := elemSize(e.Codec)
	if size == 0 {
		return Span{}, fmt.Errorf("span: %w %q", ErrUnknownCodec, e.Codec)
	}
	align := e.Align()
	if align <= 0 {
		return Span{}, fmt.Errorf("span: %w: int8 block size %d", ErrMalformed, e.BlockSize)
	}
	if lo < 0 || hi < lo || hi > e.N {
		return Span{}, fmt.Errorf("span: %w: range [%d, %d) of %d values", ErrLengthMismatch, lo, hi, e.N)
	}
	if lo%align != 0 {
		return Span{}, fmt.Errorf("span: %w: range starts at %d, not a multiple of the %s unit %d", ErrBadConfig, lo, e.Codec, align)
	}
	s := Span{Lo: lo, Hi: hi, DataBegin: lo * size, DataEnd: hi * size}
	if e.Codec == Int8 {
		s.ScaleBegin = lo / align
		s.ScaleEnd = s.ScaleBegin + parallel.NumChunks(hi-lo, align)
	}
	return s, nil
}

// Slice returns values [lo, hi) of e as an Encoded of hi−lo values that shares e's bytes
// (no copy): decoding it gives the same bits as decoding all of e and taking [lo, hi).
// e is validated first, so a malformed e gives an error rather than an out-of-range view.
func (e Encoded) Slice(lo, hi int) (Encoded, error) {
	if err := e.Validate(); err != nil {
		return Encoded{}, fmt.Errorf("slice: %w", err)
	}
	s, err := e.Span(lo, hi)
	if err != nil {
		return Encoded{}, fmt.Errorf("slice: %w", err)
	}
	return s.View(e, e.Data[s.DataBegin:s.DataEnd], e.Scales[s.ScaleBegin:s.ScaleEnd], e.Index[s.IndexBegin:s.IndexEnd]), nil
}

// View assembles the self-contained encoding of the span's values from the bytes a reader
// fetched for it: data must be Data[DataBegin:DataEnd], scales Scales[ScaleBegin:ScaleEnd]
// and index Index[IndexBegin:IndexEnd] (empty but for sparse) of the full encoding described
// by full (whose Data, Scales and Index may be empty). Decode validates the result, so wrong
// lengths give an error, never a bad read.
func (s Span) View(full Encoded, data []byte, scales []float32, index []byte) Encoded {
	v := Encoded{Codec: full.Codec, N: s.Hi - s.Lo, Data: data}
	switch full.Codec {
	case Int8:
		v.BlockSize, v.Scales = full.BlockSize, scales
	case Sparse:
		v.BlockSize, v.TopK, v.Scales, v.Index = full.BlockSize, full.TopK, scales, index
	}
	return v
}

// DecodeRange writes values [lo, lo+len(dst)) of e into dst: the same bits as a full
// Decode of e followed by copying that range. lo must be a multiple of e.Align().
func DecodeRange(e Encoded, lo int, dst []float32, workers int) error {
	if hi := lo + len(dst); e.Codec == Sparse && e.BlockSize > 0 && hi%e.BlockSize != 0 && hi != e.N && lo >= 0 && hi <= e.N {
		// The range ends inside a block: decode that whole block, keep its head.
		end := min(e.N, (hi/e.BlockSize+1)*e.BlockSize)
		v, err := e.Slice(lo, end)
		if err != nil {
			return fmt.Errorf("decode range: %w", err)
		}
		tmp := make([]float32, end-lo)
		if err := Decode(v, tmp, workers); err != nil {
			return err
		}
		copy(dst, tmp)
		return nil
	}
	v, err := e.Slice(lo, lo+len(dst))
	if err != nil {
		return fmt.Errorf("decode range: %w", err)
	}
	return Decode(v, dst, workers)
}
