package pack

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func testPack(t *testing.T) *Pack {
	t.Helper()
	layout := Layout{{Name: "a.bias", Shape: []int64{3}}, {Name: "a.weight", Shape: []int64{3, 2}}, {Name: "scale", Shape: nil}}
	vals := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, -0.5}
	p, err := New(layout, vals, map[string]string{"round": "1"})
	require.NoError(t, err)
	return p
}

func TestPackRoundTripIsCanonical(t *testing.T) {
	p := testPack(t)
	var b1 bytes.Buffer
	_, err := p.WriteTo(&b1)
	require.NoError(t, err)
	require.Zero(t, (8+binary.LittleEndian.Uint64(b1.Bytes()))%8, "data starts 8-aligned")

	f, err := Parse(b1.Bytes())
	require.NoError(t, err)
	q, err := FromFile(f)
	require.NoError(t, err)
	require.Equal(t, p.Values, q.Values)
	require.True(t, SameLayout(p.Layout, q.Layout))
	require.Equal(t, Format, q.Meta["format"])
	require.Equal(t, p.Layout.Hash(), q.Meta["layout_hash"])
	w, ok := q.Tensor("a.weight")
	require.True(t, ok)
	require.Equal(t, []float32{4, 5, 6, 7, 8, 9}, w)

	var b2 bytes.Buffer
	q.Meta = map[string]string{"round": "1"}
	_, err = q.WriteTo(&b2)
	require.NoError(t, err)
	require.Equal(t, b1.Bytes(), b2.Bytes(), "same values, same bytes")
}

func TestLayoutHashIsPinned(t *testing.T) {
	// Python's p2ptrain.safetensors.layout_hash must agree; this pins the definition.
	l := Layout{{Name: "fc1.bias", Shape: []int64{128}}, {Name: "fc1.weight", Shape: []int64{128, 64}}, {Name: "s", Shape: nil}}
	require.Equal(t, "fc1.bias:F32:128\nfc1.weight:F32:128x64\ns:F32:\n", l.String())
	require.Len(t, l.Hash(), 64)
}

func TestLoadFileAndFinite(t *testing.T) {
	p := testPack(t)
	path := filepath.Join(t.TempDir(), "p.safetensors")
	require.NoError(t, p.WriteFile(path))
	q, err := Load(path)
	require.NoError(t, err)
	defer q.Close()
	require.Equal(t, "", q.Finite())
	p.Values[4] = float32(math.NaN())
	require.Equal(t, "a.weight", p.Finite())
	require.NoError(t, q.CheckLayout(p.Layout))
	require.ErrorIs(t, q.CheckLayout(Layout{{Name: "x", Shape: []int64{10}}}), ErrLayoutMismatch)
}

func header(t *testing.T, json string, data int) []byte {
	b := make([]byte, 8, 8+len(json)+data)
	binary.LittleEndian.PutUint64(b, uint64(len(json)))
	b = append(b, json...)
	return append(b, make([]byte, data)...)
}

func TestMalformedFilesAreRejected(t *testing.T) {
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"short", []byte{1, 2, 3}, "shorter than"},
		{"huge header length", binary.LittleEndian.AppendUint64(nil, 1<<40), "out of range"},
		{"header past end", append(binary.LittleEndian.AppendUint64(nil, 100), '{', '}'), "exceeds file size"},
		{"not json", header(t, "[1,2]", 0), "not a UTF-8 JSON object"},
		{"bad dtype", header(t, `{"x":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}}`, 1), "unknown dtype"},
		{"wrong length", header(t, `{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 4), "want 8"},
		{"past data", header(t, `{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 4), "outside data"},
		{"overlap", header(t, `{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), "overlap"},
		{"negative dim", header(t, `{"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}`, 0), "bad shape"},
		{"bad metadata", header(t, `{"__metadata__":{"a":1}}`, 0), "__metadata__"},
		{"unknown tensor field", header(t, `{"x":{"dtype":"F32","shape":[],"data_offsets":[0,4],"extra":1}}`, 4), "unknown field"},
		{"trailing json", header(t, `{} {}`, 0), "trailing"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.file)
			require.ErrorIs(t, err, ErrMalformed)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestNotAPack(t *testing.T) {
	cases := []struct {
		name, json string
		data       int
		want       string
	}{
		{"f16", `{"x":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, 4, "F32 only"},
		{"gap", `{"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8, "contiguous"},
		{"order", `{"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8, "name order"},
		{"layout hash", `{"__metadata__":{"layout_hash":"00"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 4, "layout_hash"},
		{"extra data", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 8, "data bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse(header(t, tc.json, tc.data))
			require.NoError(t, err)
			_, err = FromFile(f)
			require.Error(t, err)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestLoadMissingFileNamesIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing.safetensors")
	_, err := Load(path)
	require.ErrorContains(t, err, path)
	require.NoError(t, os.WriteFile(path, []byte("garbage!garbage!"), 0o644))
	_, err = Load(path)
	require.ErrorContains(t, err, path)
	require.ErrorIs(t, err, ErrMalformed)
}

func FuzzParse(f *testing.F) {
	var b bytes.Buffer
	p, _ := New(Layout{{Name: "w", Shape: []int64{2, 2}}}, []float32{1, 2, 3, 4}, nil)
	_, _ = p.WriteTo(&b)
	f.Add(b.Bytes())
	f.Add(header(nil, `{"x":{"dtype":"I8","shape":[3],"data_offsets":[0,3]}}`, 3))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			return
		}
		for _, ti := range file.Header.Tensors {
			_ = file.Bytes(ti) // must stay in bounds
		}
		if p, err := FromFile(file); err == nil {
			var out bytes.Buffer
			if _, err := p.WriteTo(&out); err != nil {
				t.Fatalf("a pack that parses must re-encode: %v", err)
			}
		}
	})
}

func TestParamCount(t *testing.T) {
	dir := t.TempDir()
	p := testPack(t)
	good := filepath.Join(dir, "p.safetensors")
	require.NoError(t, p.WriteFile(good))
	notPack := filepath.Join(dir, "f16.safetensors")
	require.NoError(t, os.WriteFile(notPack, header(t, `{"x":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, 4), 0o644))
	cases := []struct {
		name, path string
		want       int64
	}{
		{"a pack", good, int64(len(p.Values))},
		{"not a pack", notPack, 0},
		{"missing", filepath.Join(dir, "none"), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, ParamCount(tc.path))
		})
	}
}
