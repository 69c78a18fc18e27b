package round

import (
	"bufio"
	"fmt"
	"strconv"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/pack"
)

// encodeStreaming encodes the pseudo-gradient base − local with a dense codec (fp32, fp16,
// int8) and stores it, a block at a time: base and local are read with positioned reads
// and the encoded bytes go straight to the store, so the trainer holds a few blocks (and
// the error-feedback residual it keeps anyway) instead of the delta and its encoding. The
// artifact is byte for byte the one StoreDelta writes for diloco.Encode of the whole delta,
// and residual ends the same. It returns the delta's norm, as merge.Norm computes it.
func encodeStreaming(store *artifact.Store, baseR, localR *pack.PackReader, codec diloco.Codec, int8Block int, residual []float32, workers int) (cid.Cid, float64, error) {
	n := int(baseR.Layout.Params())
	layoutHash := baseR.Layout.Hash()
	dt, ok := codecDType[codec]
	if !ok || codec == diloco.Sparse {
		return cid.Undef, 0, fmt.Errorf("stream encode: codec %q", codec)
	}
	if residual != nil && len(residual) != n {
		return cid.Undef, 0, fmt.Errorf("stream encode: %d residual values for %d parameters", len(residual), n)
	}
	size := map[diloco.Codec]int{diloco.FP32: 4, diloco.FP16: 2, diloco.Int8: 1}[codec]
	block := StreamBlock
	meta := map[string]string{"format": DeltaFormat, "codec": string(codec), "n": strconv.Itoa(n), "layout_hash": layoutHash}
	infos := []pack.TensorInfo{{Name: "delta", DType: dt, Shape: []int64{int64(n)}, Begin: 0, End: int64(n * size)}}
	var scales []float32
	if codec == diloco.Int8 {
		if int8Block == 0 {
			int8Block = diloco.DefaultBlockSize
		}
		if int8Block < 0 {
			return cid.Undef, 0, fmt.Errorf("stream encode: int8 block %d", int8Block)
		}
		// Blocks of whole int8 blocks, of about StreamBlock values.
		block = max(1, StreamBlock/int8Block) * int8Block
		scales = make([]float32, 0, (n+int8Block-1)/int8Block)
		meta["block_size"] = strconv.Itoa(int8Block)
		ns := int64((n + int8Block - 1) / int8Block)
		infos = append(infos, pack.TensorInfo{Name: "scales", DType: pack.F32, Shape: []int64{ns}, Begin: int64(n * size), End: int64(n*size) + 4*ns})
	}
	hdr, err := pack.EncodeHeader(infos, meta)
	if err != nil {
		return cid.Undef, 0, err
	}
	w, err := store.Create()
	if err != nil {
		return cid.Undef, 0, err
	}
	defer w.Abort()
	bw := bufio.NewWriterSize(w, 1<<20)
	if _, err := bw.Write(hdr); err != nil {
		return cid.Undef, 0, fmt.Errorf("store delta: %w", err)
	}
	var norm merge.NormAccumulator
	bl := min(block, n)
	b, l, d := make([]float32, bl), make([]float32, bl), make([]float32, bl)
	for lo := 0; lo < n; lo += block {
		hi := min(lo+block, n)
		bb, lb, db := b[:hi-lo], l[:hi-lo], d[:hi-lo]
		if err := baseR.ReadValues(int64(lo), bb); err != nil {
			return cid.Undef, 0, err
		}
		if err := localR.ReadValues(int64(lo), lb); err != nil {
			return cid.Undef, 0, fmt.Errorf("worker output: %w", err)
		}
		if i := merge.FirstNonFinite(lb, workers); i >= 0 {
			return cid.Undef, 0, fmt.Errorf("%w: worker returned NaN/Inf in tensor %q", ErrNonFinite, localR.Layout.NameAt(int64(lo+i)))
		}
		if err := diloco.PseudoGradient(db, bb, lb, workers); err != nil {
			return cid.Undef, 0, err
		}
		norm.Add(db)
		var res []float32
		if residual != nil {
			res = residual[lo:hi]
		}
		enc, err := diloco.Encode(codec, db, res, int8Block, workers)
		if err != nil {
			return cid.Undef, 0, fmt.Errorf("encode delta: values [%d, %d): %w", lo, hi, err)
		}
		if _, err := bw.Write(enc.Data); err != nil {
			return cid.Undef, 0, fmt.Errorf("store delta: %w", err)
		}
		scales = append(scales, enc.Scales...)
	}
	if codec == diloco.Int8 {
		if _, err := bw.Write(pack.Float32Bytes(scales)); err != nil {
			return cid.Undef, 0, fmt.Errorf("store delta: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return cid.Undef, 0, fmt.Errorf("store delta: %w", err)
	}
	id, err := w.Commit()
	if err != nil {
		return cid.Undef, 0, err
	}
	return id, norm.Norm(), nil
}
