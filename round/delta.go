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
	e, dataT, scalesT, err := parseDeltaHeader(f.Header, layoutHash, n)
	if err != nil {
		return diloco.Encoded{}, err
	}
	e.Data = f.Bytes(dataT)
	if e.Codec == diloco.Int8 {
		if e.Scales, err = pack.Float32s(f.Bytes(scalesT)); err != nil {
			return diloco.Encoded{}, fmt.Errorf("delta: %w", err)
		}
	}
	return e, nil
}

// parseDeltaHeader checks a delta file's header and returns the encoding's description
// (codec, length, block size; no data) and its data and scales tensors.
func parseDeltaHeader(h *pack.Header, layoutHash string, n int) (diloco.Encoded, pack.TensorInfo, pack.TensorInfo, error) {
	var none pack.TensorInfo
	meta := h.Metadata
	if meta["format"] != DeltaFormat {
		return diloco.Encoded{}, none, none, fmt.Errorf("delta: format %q, want %q", meta["format"], DeltaFormat)
	}
	if meta["layout_hash"] != layoutHash {
		return diloco.Encoded{}, none, none, fmt.Errorf("delta: %w: delta is for layout %s, base head has %s", pack.ErrLayoutMismatch, meta["layout_hash"], layoutHash)
	}
	codec, err := diloco.ParseCodec(meta["codec"])
	if err != nil {
		return diloco.Encoded{}, none, none, fmt.Errorf("delta: %w", err)
	}
	t, ok := h.Find("delta")
	if !ok || t.DType != codecDType[codec] || len(t.Shape) != 1 || t.Shape[0] != int64(n) {
		return diloco.Encoded{}, none, none, fmt.Errorf("delta: tensor \"delta\" must be %s[%d]", codecDType[codec], n)
	}
	e := diloco.Encoded{Codec: codec, N: n}
	if codec != diloco.Int8 {
		return e, t, none, nil
	}
	bs, err := strconv.Atoi(meta["block_size"])
	if err != nil || bs <= 0 || bs > MaxInt8Block {
		return diloco.Encoded{}, none, none, fmt.Errorf("delta: bad block_size %q (want 1 to %d)", meta["block_size"], MaxInt8Block)
	}
	st, ok := h.Find("scales")
	if !ok || st.DType != pack.F32 || len(st.Shape) != 1 || st.Shape[0] != int64((n+bs-1)/bs) {
		return diloco.Encoded{}, none, none, fmt.Errorf("delta: int8 codec needs an F32 \"scales\" tensor of %d values", (n+bs-1)/bs)
	}
	e.BlockSize = bs
	return e, t, st, nil
}

// MaxInt8Block is the largest int8 block a delta may declare (config protocol.int8_block
// has the same bound); it bounds the scratch a streaming decode needs.
const MaxInt8Block = 1 << 20
