package round

import (
	"bufio"
	"fmt"
	"strconv"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/pack"
)

// DeltaFormat is __metadata__.format of an encoded pseudo-gradient file.
const DeltaFormat = "p2ptrain-delta/1"

var codecDType = map[diloco.Codec]pack.DType{diloco.FP32: pack.F32, diloco.FP16: pack.F16, diloco.Int8: pack.I8}

// StoreDelta writes an encoded pseudo-gradient as a safetensors artifact.
func StoreDelta(store *artifact.Store, e diloco.Encoded, layoutHash string) (cid.Cid, error) {
	dt, ok := codecDType[e.Codec]
	if !ok {
		return cid.Undef, fmt.Errorf("store delta: unknown codec %q", e.Codec)
	}
	tensors := []pack.Tensor{{Name: "delta", DType: dt, Shape: []int64{int64(e.N)}, Data: e.Data}}
	meta := map[string]string{"format": DeltaFormat, "codec": string(e.Codec), "n": strconv.Itoa(e.N), "layout_hash": layoutHash}
	if e.Codec == diloco.Int8 {
		tensors = append(tensors, pack.Tensor{Name: "scales", DType: pack.F32, Shape: []int64{int64(len(e.Scales))}, Data: pack.Float32Bytes(e.Scales)})
		meta["block_size"] = strconv.Itoa(e.BlockSize)
	}
	w, err := store.Create()
	if err != nil {
		return cid.Undef, err
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	if err := pack.Write(bw, tensors, meta); err != nil {
		w.Abort()
		return cid.Undef, fmt.Errorf("store delta: %w", err)
	}
	if err := bw.Flush(); err != nil {
		w.Abort()
		return cid.Undef, fmt.Errorf("store delta: %w", err)
	}
	return w.Commit()
}

// ParseDelta views an encoded pseudo-gradient file (no copy of the payload) and checks it
// applies to a pack of the given layout.
func ParseDelta(b []byte, layoutHash string, n int) (diloco.Encoded, error) {
	f, err := pack.Parse(b)
	if err != nil {
		return diloco.Encoded{}, fmt.Errorf("delta: %w", err)
	}
	meta := f.Header.Metadata
	if meta["format"] != DeltaFormat {
		return diloco.Encoded{}, fmt.Errorf("delta: format %q, want %q", meta["format"], DeltaFormat)
	}
	if meta["layout_hash"] != layoutHash {
		return diloco.Encoded{}, fmt.Errorf("delta: %w: delta is for layout %s, base head has %s", pack.ErrLayoutMismatch, meta["layout_hash"], layoutHash)
	}
	codec, err := diloco.ParseCodec(meta["codec"])
	if err != nil {
		return diloco.Encoded{}, fmt.Errorf("delta: %w", err)
	}
	t, ok := f.Header.Find("delta")
	if !ok || t.DType != codecDType[codec] || len(t.Shape) != 1 || t.Shape[0] != int64(n) {
		return diloco.Encoded{}, fmt.Errorf("delta: tensor \"delta\" must be %s[%d]", codecDType[codec], n)
	}
	e := diloco.Encoded{Codec: codec, N: n, Data: f.Bytes(t)}
	if codec == diloco.Int8 {
		bs, err := strconv.Atoi(meta["block_size"])
		if err != nil || bs <= 0 {
			return diloco.Encoded{}, fmt.Errorf("delta: bad block_size %q", meta["block_size"])
		}
		st, ok := f.Header.Find("scales")
		if !ok || st.DType != pack.F32 {
			return diloco.Encoded{}, fmt.Errorf("delta: int8 codec needs an F32 \"scales\" tensor")
		}
		scales, err := pack.Float32s(f.Bytes(st))
		if err != nil {
			return diloco.Encoded{}, fmt.Errorf("delta: %w", err)
		}
		e.BlockSize, e.Scales = bs, scales
	}
	return e, nil
}
