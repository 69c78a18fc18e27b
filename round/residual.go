package round

import (
	"bytes"
	"fmt"
	"io"

	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/pack"
)

// ResidualFormat is __metadata__.format of a trainer's error-feedback residual file.
const ResidualFormat = "p2ptrain-residual/1"

// ResidualTag names what a residual is the remainder of: codec, block size, top-k (sparse)
// and the layout hash of the packs it was computed on. The trainer keeps a residual only
// while its tag stays the same; it starts again from zeros when
//
//   - the codec or its settings change (an int8 residual is a rounding error, a sparse one
//     most of the update: neither means anything to the other codec);
//   - the model's layout changes (the coordinates no longer line up);
//   - the residual's length differs from the delta's, or its checkpoint file does not parse.
//
// It is kept across rounds whatever the base head: the residual is the part of earlier
// pseudo-gradients that was never sent, which is still owed to the model — also when the
// trainer skipped rounds or its last contribution was not merged (then what it did send is
// lost, as it would be without error feedback).
func ResidualTag(codec diloco.Codec, block, topK int, layoutHash string) string {
	if block == 0 {
		switch codec {
		case diloco.Int8:
			block = diloco.DefaultBlockSize
		case diloco.Sparse:
			block = diloco.DefaultSparseBlock
		}
	}
	if codec == diloco.Sparse && topK == 0 {
		topK = diloco.DefaultSparseTopKFor(block)
	}
	return fmt.Sprintf("%s/%d/%d/%s", codec, block, topK, layoutHash)
}

// EncodeResidual writes a residual and its tag as a safetensors file: one F32 tensor
// "residual" and __metadata__ {format, tag}.
func EncodeResidual(r []float32, tag string) ([]byte, error) {
	var buf bytes.Buffer
	err := pack.Write(&buf, []pack.Tensor{{Name: "residual", DType: pack.F32, Shape: []int64{int64(len(r))}, Data: pack.Float32Bytes(r)}},
		map[string]string{"format": ResidualFormat, "tag": tag})
	if err != nil {
		return nil, fmt.Errorf("encode residual: %w", err)
	}
	return buf.Bytes(), nil
}

// ParseResidual reads what EncodeResidual wrote; the values are copied out of b. A
// residual holding NaN or ±Inf is refused: it would poison every later encoding.
func ParseResidual(b []byte) ([]float32, string, error) {
	f, err := pack.Parse(b)
	if err != nil {
		return nil, "", fmt.Errorf("residual: %w", err)
	}
	if f.Header.Metadata["format"] != ResidualFormat {
		return nil, "", fmt.Errorf("residual: format %q, want %q", f.Header.Metadata["format"], ResidualFormat)
	}
	t, ok := f.Header.Find("residual")
	if !ok || t.DType != pack.F32 || len(t.Shape) != 1 {
		return nil, "", fmt.Errorf("residual: needs a one-dimensional F32 tensor \"residual\"")
	}
	v, err := pack.Float32s(f.Bytes(t))
	if err != nil {
		return nil, "", fmt.Errorf("residual: %w", err)
	}
	out := make([]float32, len(v))
	copy(out, v)
	if i := merge.FirstNonFinite(out, 0); i >= 0 {
		return nil, "", fmt.Errorf("residual: element %d is %v", i, out[i])
	}
	return out, f.Header.Metadata["tag"], nil
}

// WriteResidual writes what EncodeResidual returns to w, streaming: the values are written
// from r itself, not copied.
func WriteResidual(w io.Writer, r []float32, tag string) error {
	err := pack.Write(w, []pack.Tensor{{Name: "residual", DType: pack.F32, Shape: []int64{int64(len(r))}, Data: pack.Float32Bytes(r)}},
		map[string]string{"format": ResidualFormat, "tag": tag})
	if err != nil {
		return fmt.Errorf("write residual: %w", err)
	}
	return nil
}

// ReadResidual reads a residual file (what EncodeResidual wrote) with block reads into
// the slice it returns: the process holds the residual once, not also a mapping of the
// file. Like ParseResidual it refuses NaN or ±Inf and names the file in errors.
func ReadResidual(path string) ([]float32, string, error) {
	r, err := pack.OpenReader(path)
	if err != nil {
		return nil, "", fmt.Errorf("residual: %w", err)
	}
	defer r.Close()
	if r.Header.Metadata["format"] != ResidualFormat {
		return nil, "", fmt.Errorf("residual %s: format %q, want %q", path, r.Header.Metadata["format"], ResidualFormat)
	}
	t, ok := r.Header.Find("residual")
	if !ok || t.DType != pack.F32 || len(t.Shape) != 1 {
		return nil, "", fmt.Errorf("residual %s: needs a one-dimensional F32 tensor \"residual\"", path)
	}
	out := make([]float32, t.Elements())
	if err := r.ReadTensor(t, 0, pack.Float32Bytes(out)); err != nil {
		return nil, "", fmt.Errorf("residual: %w", err)
	}
	if i := merge.FirstNonFinite(out, 0); i >= 0 {
		return nil, "", fmt.Errorf("residual %s: element %d is %v", path, i, out[i])
	}
	return out, r.Header.Metadata["tag"], nil
}
