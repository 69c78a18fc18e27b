package export

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/internal/testenv"
)

// readerScript parses safetensors with json + numpy only: an independent reader.
const readerScript = "../pyruntime/python/tests/export_reader.py"

func python(t *testing.T) string {
	t.Helper()
	py := os.Getenv("P2PNODE_PYTHON")
	if py == "" {
		py = "/usr/bin/python3" // the interpreter the Makefile and Debian's numpy use
	}
	if _, err := exec.LookPath(py); err != nil {
		testenv.Missing(t, "independent reader: no Python at %s (set P2PNODE_PYTHON): %v", py, err)
	}
	return py
}

// TestIndependentReader exports a head (values including NaN, ±Inf, -0 and subnormals) as
// one file and as shards, then has numpy load each directory and compare every tensor bit
// for bit with the head's parameter pack, and check the metadata.
func TestIndependentReader(t *testing.T) {
	py := python(t)
	l := smallLayout()
	vals := values(l, 4)
	copy(vals, []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32})
	st := newStores(t, t.TempDir(), 0)
	id := st.putHead(t, l, vals, 0, cid.Undef)
	src, err := OpenHead(st.arts, st.heads, id)
	require.NoError(t, err)
	defer src.Close()
	meta, err := json.Marshal(map[string]string{"head": id.String(), "round": "0", "experiment": "exp", "network": "net", "layout_hash": l.Hash()})
	require.NoError(t, err)

	for _, shard := range []int64{0, 64 << 10} {
		dir := t.TempDir()
		_, err := Export(ctx, src, dir, Options{ShardBytes: shard})
		require.NoError(t, err)
		out, err := exec.Command(py, readerScript, dir, st.arts.BlobPath(src.Meta.Params), string(meta)).CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 3 {
			testenv.Missing(t, "independent reader skipped: %s", strings.TrimSpace(string(out)))
		}
		require.NoError(t, err, "%s", out)
		t.Logf("shard size %d: %s", norm(shard), strings.TrimSpace(string(out)))
	}

	// The reader is not blind: a changed value is reported.
	dir := t.TempDir()
	_, err = Export(ctx, src, dir, Options{})
	require.NoError(t, err)
	path := filepath.Join(dir, SingleFile)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[len(b)-1] ^= 1
	require.NoError(t, os.WriteFile(path, b, 0o644))
	out, err := exec.Command(py, readerScript, dir, st.arts.BlobPath(src.Meta.Params)).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "MISMATCH")
}
