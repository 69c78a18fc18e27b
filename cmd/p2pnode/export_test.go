package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/node"
	"github.com/p2pnode/p2pnode/pack"
)

// putHead stores a head of round with the given values in the node's store and makes it
// the tip, as a running node would.
func putHead(t *testing.T, storeDir string, vals []float32, round uint64, parent cid.Cid) cid.Cid {
	t.Helper()
	arts, err := artifact.OpenStore(filepath.Join(storeDir, "artifacts"), artifact.Options{})
	require.NoError(t, err)
	heads, err := chain.OpenStore(filepath.Join(storeDir, "heads"))
	require.NoError(t, err)
	layout := pack.Layout{{Name: "fc.bias", Shape: []int64{64}}, {Name: "fc.weight", Shape: []int64{64, int64(len(vals)-64) / 64}}}
	p, err := pack.New(layout, vals, nil)
	require.NoError(t, err)
	w, err := arts.Create()
	require.NoError(t, err)
	bw := bufio.NewWriter(w)
	_, err = p.WriteTo(bw)
	require.NoError(t, err)
	require.NoError(t, bw.Flush())
	pid, err := w.Commit()
	require.NoError(t, err)
	h := &chain.Head{
		Version: 1, Network: "net", Experiment: "cli", Round: round, Params: pid.Bytes(), LayoutHash: layout.Hash(),
		Policy: chain.Policy{Kind: "diloco", Aggregator: "mean", Codec: "fp32"},
		Ledger: chain.Ledger{Plan: "p", Shards: 1, Consumed: []byte{0}},
	}
	if parent.Defined() {
		h.Parent = parent.Bytes()
	}
	b, err := h.Encode()
	require.NoError(t, err)
	_, err = heads.Put(&chain.SignedHead{Head: b})
	require.NoError(t, err)
	id, err := h.ID()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(storeDir, node.TipFile), []byte(id.String()+"\n"), 0o644))
	return id
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append(args, "--log-level", "error"))
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestExportAndVerifyCommands(t *testing.T) {
	base := t.TempDir()
	storeDir := filepath.Join(base, "store")
	cfg := filepath.Join(base, "p2pnode.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("node:\n  store_dir: store\n"), 0o644))
	vals := make([]float32, 64+64*4096) // 1 MiB
	for i := range vals {
		vals[i] = float32(i%977) / 977
	}
	first := putHead(t, storeDir, vals, 0, cid.Undef)
	out := filepath.Join(base, "model")

	stdout, err := run(t, "export", "--config", cfg, "--head", first.String(), "--out", out)
	require.NoError(t, err, stdout)
	require.Contains(t, stdout, "full export of head "+first.String()+" (round 0)")
	require.FileExists(t, filepath.Join(out, "model.safetensors"))

	vals[5000] = -1
	second := putHead(t, storeDir, vals, 1, first)
	stdout, err = run(t, "export", "--config", cfg, "--out", out, "--in-place", "--block-bytes", "4096")
	require.NoError(t, err, stdout)
	require.Contains(t, stdout, "in-place sync (4.0 KiB blocks) of head "+second.String()+" (round 1)")
	require.Contains(t, stdout, "blocks")
	t.Logf("export --in-place:\n%s", stdout)

	stdout, err = run(t, "verify", "--config", cfg, "--head", second.String(), "--dir", out)
	require.NoError(t, err, stdout)
	require.Equal(t, 4, strings.Count(stdout, "OK "), stdout)
	t.Logf("verify:\n%s", stdout)

	// The directory holds the second head, not the first: verify says what differs.
	stdout, err = run(t, "verify", "--config", cfg, "--head", first.String(), "--dir", out)
	require.Error(t, err)
	require.Contains(t, stdout, `BAD  model.safetensors: tensor "fc.weight": sha256`)

	// A sync into a model of another layout is refused with the file named.
	stdout, err = run(t, "export", "--config", cfg, "--out", out, "--in-place", "--shard-bytes", "65536")
	require.Error(t, err)
	require.Contains(t, err.Error(), "model.safetensors")
	require.Contains(t, err.Error(), "without --in-place")
	_ = stdout
}
