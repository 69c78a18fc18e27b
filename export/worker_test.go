package export

import (
	"context"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/internal/testenv"
	"github.com/p2pnode/p2pnode/pack"
	"github.com/p2pnode/p2pnode/pyruntime"
)

// TestExportEqualsTheWorkersModel exports a head made from a real workload's parameters
// (the digits MLP, initialised by the Python worker), has the worker load that head, and
// has the independent numpy reader compare every tensor of the export — names, shapes and
// bits — with the state dict the worker's model then holds.
func TestExportEqualsTheWorkersModel(t *testing.T) {
	py := python(t)
	if out, err := exec.Command(py, "-c", "import torch, numpy, sklearn").CombinedOutput(); err != nil {
		testenv.Missing(t, "%s cannot import torch, numpy and sklearn: %v: %s", py, err, strings.TrimSpace(string(out)))
	}
	w, err := pyruntime.NewWorker(pyruntime.Options{
		Interpreter: py, Factory: "p2ptrain.workloads.digits:Digits", Threads: 1, Device: "cpu",
		Logger: slog.New(slog.DiscardHandler), CallTimeout: time.Minute, TrainTimeout: time.Minute,
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, w.Close()) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err = w.Start(ctx)
	require.NoError(t, err)

	// The worker's freshly initialised model becomes a head's parameters.
	initPath := filepath.Join(w.ScratchDir(), "init.safetensors")
	require.NoError(t, w.Init(ctx, 7, initPath))
	ip, err := pack.Load(initPath)
	require.NoError(t, err)
	layout, vals := ip.Layout, append([]float32(nil), ip.Values...)
	require.NoError(t, ip.Close())
	st := newStores(t, t.TempDir(), 0)
	id := st.putHead(t, layout, vals, 0, cid.Undef)
	src, err := OpenHead(st.arts, st.heads, id)
	require.NoError(t, err)
	defer src.Close()

	// The worker loads the head and writes out its model's state dict.
	_, err = w.Load(ctx, st.arts.BlobPath(src.Meta.Params))
	require.NoError(t, err)
	model := filepath.Join(w.ScratchDir(), "model.safetensors")
	_, err = w.Export(ctx, model)
	require.NoError(t, err)

	for _, shard := range []int64{0, 32 << 10} {
		dir := t.TempDir()
		_, err := Export(ctx, src, dir, Options{ShardBytes: shard})
		require.NoError(t, err)
		out, err := exec.Command(py, readerScript, dir, model).CombinedOutput()
		require.NoError(t, err, "%s", out)
		t.Logf("shard size %d: %s", norm(shard), strings.TrimSpace(string(out)))
	}
}
