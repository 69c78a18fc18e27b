package export

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/pack"
)

// smallLayout is a model of a few tensors (about 200 KiB), names as a state dict has them.
func smallLayout() pack.Layout {
	return pack.Layout{
		{Name: "decoder.bias", Shape: []int64{100}},
		{Name: "decoder.weight", Shape: []int64{100, 128}},
		{Name: "encoder.bias", Shape: []int64{128}},
		{Name: "encoder.weight", Shape: []int64{128, 256}},
		{Name: "scale", Shape: nil},
	}
}

// values fills a layout deterministically from seed.
func values(layout pack.Layout, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 7))
	v := make([]float32, layout.Params())
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// fakeCID names a head or params artifact in metadata for sources without stores.
func fakeCID(kind string, round uint64) cid.Cid {
	return cids.Record(fmt.Appendf(nil, "%s-%d", kind, round))
}

// memSource is an in-memory source for round, values from seed.
func memSource(t testing.TB, layout pack.Layout, seed, round uint64) *Source {
	t.Helper()
	p, err := pack.New(layout, values(layout, seed), nil)
	require.NoError(t, err)
	src, err := NewSource(Meta{Network: "net", Experiment: "exp", Round: round, Head: fakeCID("head", round), Params: fakeCID("params", round)}, p)
	require.NoError(t, err)
	return src
}

// withRound is src's values under another round's metadata (a copy of the data).
func withRound(src *Source, round uint64) *Source {
	return &Source{
		Meta:   Meta{Network: src.Meta.Network, Experiment: src.Meta.Experiment, Round: round, Head: fakeCID("head", round), Params: fakeCID("params", round)},
		Layout: src.Layout,
		Data:   slices.Clone(src.Data),
	}
}

// changeBlocks changes one float in each of the given fraction of the blocks (file offsets
// of the single-file export, header length hdr) that hold data, and returns how many.
func changeBlocks(src *Source, hdr int64, block int, fraction float64, rng *rand.Rand) int {
	size := hdr + int64(len(src.Data))
	nblocks := int((size + int64(block) - 1) / int64(block))
	want := int(float64(nblocks) * fraction)
	changed := 0
	for _, b := range rng.Perm(nblocks) {
		if changed == want {
			break
		}
		lo := max(int64(b)*int64(block), hdr) - hdr
		hi := min(int64(b+1)*int64(block), size) - hdr
		i := (lo + 3) &^ 3
		if i+4 > hi {
			continue
		}
		src.Data[i+3] ^= 0x80 // the sign bit: always a different byte
		changed++
	}
	return changed
}

// dirHashes maps every model file and leftover in dir (journal, temps) to its sha256.
func dirHashes(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		if !isModelFile(e.Name()) && !isTempFile(e.Name()) && e.Name() != JournalFile {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		sum := sha256.Sum256(b)
		out[e.Name()] = hex.EncodeToString(sum[:])
	}
	return out
}

// expectedHashes renders a plan in memory: what an export of src must leave in a directory.
func expectedHashes(t testing.TB, src *Source, shardBytes int64) map[string]string {
	t.Helper()
	p, err := makePlan(src, shardBytes)
	require.NoError(t, err)
	out := map[string]string{}
	for _, f := range p.files {
		h := sha256.New()
		h.Write(f.header)
		h.Write(src.Data[f.begin:f.end])
		out[f.name] = hex.EncodeToString(h.Sum(nil))
	}
	if p.index != nil {
		sum := sha256.Sum256(p.index)
		out[IndexFile] = hex.EncodeToString(sum[:])
	}
	return out
}

// testStores is a node's stores holding heads.
type testStores struct {
	arts  *artifact.Store
	heads *chain.Store
}

func newStores(t testing.TB, dir string, chunk int) *testStores {
	t.Helper()
	a, err := artifact.OpenStore(filepath.Join(dir, "artifacts"), artifact.Options{ChunkSize: chunk})
	require.NoError(t, err)
	h, err := chain.OpenStore(filepath.Join(dir, "heads"))
	require.NoError(t, err)
	return &testStores{arts: a, heads: h}
}

// putHead stores values as a canonical pack and a head of round naming it.
func (s *testStores) putHead(t testing.TB, layout pack.Layout, vals []float32, round uint64, parent cid.Cid) cid.Cid {
	t.Helper()
	p, err := pack.New(layout, vals, nil)
	require.NoError(t, err)
	w, err := s.arts.Create()
	require.NoError(t, err)
	bw := bufio.NewWriter(w)
	_, err = p.WriteTo(bw)
	require.NoError(t, err)
	require.NoError(t, bw.Flush())
	pid, err := w.Commit()
	require.NoError(t, err)
	h := &chain.Head{
		Version: 1, Network: "net", Experiment: "exp", Round: round, Params: pid.Bytes(),
		LayoutHash: layout.Hash(),
		Policy:     chain.Policy{Kind: "diloco", OuterLR: 0.7, Momentum: 0.9, Nesterov: true, Aggregator: "mean", Codec: "fp32"},
		Ledger:     chain.Ledger{Plan: "plan", Shards: 8, Consumed: make([]byte, 1)},
	}
	if parent.Defined() {
		h.Parent = parent.Bytes()
	}
	b, err := h.Encode()
	require.NoError(t, err)
	_, err = s.heads.Put(&chain.SignedHead{Head: b})
	require.NoError(t, err)
	id, err := h.ID()
	require.NoError(t, err)
	return id
}
