package pack

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStreamWriterMatchesWriteTo: a pack written a few values at a time has the bytes of
// Pack.WriteTo, and a PackReader reads back every range.
func TestStreamWriterMatchesWriteTo(t *testing.T) {
	p := testPack(t)
	var want bytes.Buffer
	_, err := p.WriteTo(&want)
	require.NoError(t, err)
	for _, step := range []int{1, 3, 10} {
		var got bytes.Buffer
		sw, err := NewStreamWriter(&got, p.Layout, map[string]string{"round": "1"})
		require.NoError(t, err)
		for lo := 0; lo < len(p.Values); lo += step {
			require.NoError(t, sw.Write(p.Values[lo:min(lo+step, len(p.Values))]))
		}
		require.NoError(t, sw.Close())
		require.Equal(t, want.Bytes(), got.Bytes(), "step %d", step)
	}
	sw, err := NewStreamWriter(&bytes.Buffer{}, p.Layout, nil)
	require.NoError(t, err)
	require.NoError(t, sw.Write(p.Values[:4]))
	require.ErrorContains(t, sw.Close(), "6 of 10 values missing")
	require.Error(t, sw.Write(make([]float32, 11)))

	path := filepath.Join(t.TempDir(), "p.safetensors")
	require.NoError(t, os.WriteFile(path, want.Bytes(), 0o644))
	r, err := OpenPackReader(path)
	require.NoError(t, err)
	defer r.Close()
	require.True(t, SameLayout(p.Layout, r.Layout))
	for lo := 0; lo < len(p.Values); lo++ {
		for hi := lo; hi <= len(p.Values); hi++ {
			dst := make([]float32, hi-lo)
			require.NoError(t, r.ReadValues(int64(lo), dst))
			require.Equal(t, p.Values[lo:hi], dst)
		}
	}
	require.Error(t, r.ReadValues(8, make([]float32, 3)), "past the end")
}

// TestPackReaderTruncatedFile: a file cut short after it was opened gives an error that
// names it, not short data.
func TestPackReaderTruncatedFile(t *testing.T) {
	p := testPack(t)
	var b bytes.Buffer
	_, err := p.WriteTo(&b)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "p.safetensors")
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
	r, err := OpenPackReader(path)
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, os.Truncate(path, int64(b.Len()-8)))
	err = r.ReadValues(0, make([]float32, 10))
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, path)

	require.NoError(t, os.WriteFile(path, b.Bytes()[:b.Len()-4], 0o644))
	_, err = OpenPackReader(path)
	require.ErrorIs(t, err, ErrMalformed, "a short file is not a pack")
}
