package round

import (
	"bufio"
	"fmt"
	"strconv"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/codecs"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/pack"
)

// DeltaFormat is __metadata__.format of an encoded pseudo-gradient file.
const DeltaFormat = "p2ptrain-delta/1"

var codecDType = map[diloco.Codec]pack.DType{diloco.FP32: pack.F32, diloco.FP16: pack.F16, diloco.Int8: pack.I8, diloco.Sparse: pack.U8}

// StoreDelta writes an encoded pseudo-gradient as a safetensors artifact.
func StoreDelta(store *artifact.Store, e diloco.Encoded, layoutHash string) (cid.Cid, error) {
	dt, ok := codecDType[e.Codec]
	if !ok {
		return cid.Undef, fmt.Errorf("store delta: unknown codec %q", e.Codec)
	}
	tensors := []pack.Tensor{{Name: "delta", DType: dt, Shape: []int64{int64(e.N)}, Data: e.Data}}
	meta := map[string]string{"format": DeltaFormat, "codec": string(e.Codec), "n": strconv.Itoa(e.N), "layout_hash": layoutHash}
	switch e.Codec {
	case diloco.Int8:
		tensors = append(tensors, pack.Tensor{Name: "scales", DType: pack.F32, Shape: []int64{int64(len(e.Scales))}, Data: pack.Float32Bytes(e.Scales)})
		meta["block_size"] = strconv.Itoa(e.BlockSize)
	case diloco.Sparse:
		// "delta" holds the 2-bit values, so its length is theirs, not n.
		tensors[0].Shape = []int64{int64(len(e.Data))}
		tensors = append(tensors,
			pack.Tensor{Name: "index", DType: pack.U8, Shape: []int64{int64(len(e.Index))}, Data: e.Index},
			pack.Tensor{Name: "scales", DType: pack.F32, Shape: []int64{int64(len(e.Scales) / 2), 2}, Data: pack.Float32Bytes(e.Scales)})
		meta["block_size"] = strconv.Itoa(e.BlockSize)
		meta["top_k"] = strconv.Itoa(e.TopK)
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
	if e.Codec == diloco.Sparse {
		return parseSparse(f, n)
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
// (codec, length, block size; no data) and its data and scales tensors. For a sparse
// delta it checks the common fields only and returns the codec: parseSparse reads the rest.
func parseDeltaHeader(h *pack.Header, layoutHash string, n int) (diloco.Encoded, pack.TensorInfo, pack.TensorInfo, error) {
	var none pack.TensorInfo
	meta := h.Metadata
	if meta["format"] != DeltaFormat {
		return diloco.Encoded{}, none, none, fmt.Errorf("delta: format %q, want %q", meta["format"], DeltaFormat)
	}
	if meta["layout_hash"] != layoutHash {
		return diloco.Encoded{}, none, none, fmt.Errorf("delta: %w: delta is for layout %s, base head has %s", pack.ErrLayoutMismatch, meta["layout_hash"], layoutHash)
	}
	codec, err := codecs.Parse(meta["codec"])
	if err != nil {
		return diloco.Encoded{}, none, none, fmt.Errorf("delta: %w", err)
	}
	if codec == diloco.Sparse {
		return diloco.Encoded{Codec: codec, N: n}, none, none, nil
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

// parseSparse reads the three tensors of a sparse delta file. Their sizes against the
// layout, the scales and the positions are checked by diloco's Validate and Decode.
func parseSparse(f *pack.File, n int) (diloco.Encoded, error) {
	meta := f.Header.Metadata
	e := diloco.Encoded{Codec: diloco.Sparse, N: n}
	var err error
	if e.BlockSize, err = strconv.Atoi(meta["block_size"]); err != nil || e.BlockSize <= 0 {
		return diloco.Encoded{}, fmt.Errorf("delta: bad block_size %q", meta["block_size"])
	}
	if e.TopK, err = strconv.Atoi(meta["top_k"]); err != nil || e.TopK <= 0 {
		return diloco.Encoded{}, fmt.Errorf("delta: bad top_k %q", meta["top_k"])
	}
	if meta["n"] != strconv.Itoa(n) {
		return diloco.Encoded{}, fmt.Errorf("delta: n %q, want %d", meta["n"], n)
	}
	for _, want := range []struct {
		name string
		dt   pack.DType
		dims int
		dst  *[]byte
	}{{"delta", pack.U8, 1, &e.Data}, {"index", pack.U8, 1, &e.Index}, {"scales", pack.F32, 2, nil}} {
		t, ok := f.Header.Find(want.name)
		if !ok || t.DType != want.dt || len(t.Shape) != want.dims || (want.dims == 2 && t.Shape[1] != 2) {
			return diloco.Encoded{}, fmt.Errorf("delta: sparse codec needs a %s tensor %q of %d dimensions", want.dt, want.name, want.dims)
		}
		if want.dst != nil {
			*want.dst = f.Bytes(t)
			continue
		}
		if e.Scales, err = pack.Float32s(f.Bytes(t)); err != nil {
			return diloco.Encoded{}, fmt.Errorf("delta: %w", err)
		}
	}
	if err := e.Validate(); err != nil {
		return diloco.Encoded{}, fmt.Errorf("delta: %w", err)
	}
	return e, nil
}
