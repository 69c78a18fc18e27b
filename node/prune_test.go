package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/checkpoint"
	"github.com/p2pnode/p2pnode/dataset"
	"github.com/p2pnode/p2pnode/export"
)

// storeBytes is the size of every regular file under dir: what the node keeps on disk.
func storeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	}))
	return n
}

// datasetBytes is the size of the dataset's files.
func datasetBytes(t *testing.T, manifest string) int64 {
	t.Helper()
	m, err := dataset.Load(manifest)
	require.NoError(t, err)
	var n int64
	for _, f := range m.Files {
		n += f.Bytes
	}
	return n
}

// With node.keep_heads K, a node's store after many rounds holds about K heads'
// parameters (and outer state on a validator) and K rounds of deltas and contributions,
// whatever the number of rounds: (K + 3) × the model's bytes plus the dataset on a
// trainer. A peer asking for a pruned artifact is told it is gone at once, the chain's
// heads stay available, and audit and export still work on the pruned store.
//
// P2PNODE_PRUNE_ROUNDS, P2PNODE_PRUNE_PAD and P2PNODE_PRUNE_ARCHIVE=1 measure other runs
// (the figure in docs/storage.md: 200 rounds).
func TestStoreIsPrunedToKeepHeads(t *testing.T) {
	rounds, pad, keep := 8, 1<<16, 2
	if s := os.Getenv("P2PNODE_PRUNE_ROUNDS"); s != "" {
		rounds, _ = strconv.Atoi(s)
	}
	if s := os.Getenv("P2PNODE_PRUNE_PAD"); s != "" {
		pad, _ = strconv.Atoi(s)
	}
	archive := os.Getenv("P2PNODE_PRUNE_ARCHIVE") == "1"
	c := newCluster(t, 1, 2, rounds, 40)
	for _, n := range c.nodes {
		n.rt.Pad = pad
		n.cfg.Node.KeepHeads = keep
		n.cfg.Node.Archive = archive
		n.cfg.Lease.MinGroup = 2
		// One attempt per round: a lease that expired on a loaded machine would have its
		// trainer encode a second delta in that round, one model more than the figure
		// counts (which holds for one delta per round).
		n.cfg.Lease.MinDeadline = 20 * time.Second
		require.NoError(t, n.cfg.Validate())
	}
	val := c.nodes[0]
	// A bystander asks the validator for pruned and kept artifacts while the run goes on.
	probe := c.addPeer(len(c.nodes), "")
	require.NoError(t, c.mn.LinkAll())
	probeStore, err := artifact.OpenStore(t.TempDir(), artifact.Options{})
	require.NoError(t, err)
	x := artifact.NewExchange(probe, probeStore, artifact.ExchangeOptions{})
	t.Cleanup(func() { x.Close() })
	c.startAll()
	_, err = c.mn.ConnectPeers(probe.ID(), val.host.ID())
	require.NoError(t, err)

	probed := false
	if !archive {
		require.Eventually(t, func() bool { return val.n.Status().Round >= 5 }, time.Minute, 50*time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		f, err := chain.RequestTip(ctx, probe, val.host.ID())
		require.NoError(t, err)
		// Walk the chain back to round 1 over the network: heads are never pruned.
		tip, h := f.Head, f.Head
		for h.Round > 1 {
			parent, err := h.ParentID()
			require.NoError(t, err)
			f, err := chain.RequestHead(ctx, probe, val.host.ID(), parent)
			require.NoError(t, err, "head %s", parent)
			h = f.Head
		}
		old, err := h.ParamsID()
		require.NoError(t, err)
		start := time.Now()
		err = x.Fetch(ctx, old, val.host.ID())
		require.ErrorIs(t, err, artifact.ErrNoHolders, "round 1's parameters should have been pruned at round %d", tip.Round)
		require.ErrorContains(t, err, old.String())
		require.Less(t, time.Since(start), 10*time.Second, "asking for a pruned artifact must not retry for long")
		// The tip's parameters are still served.
		cur, err := tip.ParamsID()
		require.NoError(t, err)
		require.NoError(t, x.Fetch(ctx, cur, val.host.ID()))
		require.NoError(t, probeStore.Verify(cur))
		probed = true
	}
	c.waitDone(max(5*time.Minute, time.Duration(rounds)*3*time.Second))
	require.True(t, archive || probed)

	tipID := mustDecode(t, val.n.Status().Head)
	stores, err := OpenStores(val.cfg)
	require.NoError(t, err)
	ids, heads, err := stores.Heads.Chain(tipID)
	require.NoError(t, err, "the whole chain is kept")
	require.Len(t, heads, rounds+1)
	pid, err := heads[len(heads)-1].ParamsID()
	require.NoError(t, err)
	pm, err := stores.Artifacts.Manifest(pid)
	require.NoError(t, err)
	model := int64(pm.Size)
	data := datasetBytes(t, val.cfg.Dataset.Manifest)

	// Audit reads only the chain; export reads the tip's parameters.
	rep, err := stores.Audit(tipID)
	require.NoError(t, err)
	require.Zero(t, rep.Duplicated)
	src, err := export.OpenHead(stores.Artifacts, stores.Heads, tipID)
	require.NoError(t, err)
	require.NoError(t, src.Close())
	if !archive {
		// An old head's export fails naming the pruned parameters.
		old, err := heads[1].ParamsID()
		require.NoError(t, err)
		_, err = export.OpenHead(stores.Artifacts, stores.Heads, ids[1])
		require.ErrorIs(t, err, artifact.ErrNotFound)
		require.ErrorContains(t, err, old.String())
	}

	t.Logf("model %d bytes (fp32 pack), dataset %d bytes, keep_heads %d, archive %v, %d rounds", model, data, keep, archive, rounds)
	for _, n := range c.nodes {
		total := storeBytes(t, n.cfg.Node.StoreDir)
		arts := storeBytes(t, filepath.Join(n.cfg.Node.StoreDir, "artifacts"))
		state := storeBytes(t, filepath.Join(n.cfg.Node.StoreDir, "state"))
		hs := storeBytes(t, filepath.Join(n.cfg.Node.StoreDir, "heads"))
		t.Logf("%-10s store %10d bytes = %5.2f x model + dataset (artifacts %d, checkpoint %d, heads %d)",
			n.name, total, float64(total-data)/float64(model), arts, state, hs)
		if archive {
			continue
		}
		bound := int64(keep+3)*model + data
		if n == val {
			// A validator also keeps the outer state of K heads and K rounds of every
			// trainer's contribution (fp32 here: one model each).
			bound += int64(keep)*model + int64(keep*(len(c.nodes)-1))*model
		}
		require.LessOrEqual(t, total, bound, "%s: %d bytes on disk after %d rounds", n.name, total, rounds)
	}
}

// A stored artifact deleted by the pruner is "not found" to a peer, not an internal error,
// even when the server had seen it a moment before.
func TestPrunedArtifactIsNotFound(t *testing.T) {
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	a, err := mn.GenPeer()
	require.NoError(t, err)
	b, err := mn.GenPeer()
	require.NoError(t, err)
	require.NoError(t, mn.LinkAll())
	require.NoError(t, mn.ConnectAllButSelf())
	store, err := artifact.OpenStore(t.TempDir(), artifact.Options{ChunkSize: 1 << 12})
	require.NoError(t, err)
	store.TrackCommits()
	id, err := store.PutBytes(make([]byte, 10_000))
	require.NoError(t, err)
	keep, err := store.PutBytes([]byte("kept"))
	require.NoError(t, err)
	// Committed since the last take: a sweep must not remove it.
	gone, err := store.RemoveIdle(id)
	require.NoError(t, err)
	require.False(t, gone)
	store.TakeCommitted()
	gone, err = store.RemoveIdle(id)
	require.NoError(t, err)
	require.True(t, gone)
	require.False(t, store.Has(id))

	srv := artifact.NewExchange(a, store, artifact.ExchangeOptions{})
	defer srv.Close()
	cl, err := artifact.OpenStore(t.TempDir(), artifact.Options{ChunkSize: 1 << 12})
	require.NoError(t, err)
	x := artifact.NewExchange(b, cl, artifact.ExchangeOptions{})
	defer x.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = x.Fetch(ctx, id, a.ID())
	require.True(t, errors.Is(err, artifact.ErrNoHolders), "got %v", err)
	require.ErrorContains(t, err, id.String())
	require.NoError(t, x.Fetch(ctx, keep, a.ID()))
}

// pruneFixture is a store, a head chain and a pruner, without a network: each round adds
// a head with its parameters, outer state and one contribution, plus a delta no head
// names (a rejected or late contribution).
type pruneFixture struct {
	t       *testing.T
	dir     string
	store   *artifact.Store
	heads   *chain.Store
	tips    *tips
	p       *pruner
	data    cid.Cid
	params  []cid.Cid
	outer   []cid.Cid
	contrib []cid.Cid
	stray   []cid.Cid
	parent  cid.Cid
}

func newPruneFixture(t *testing.T, keep int) *pruneFixture {
	t.Helper()
	f := &pruneFixture{t: t, dir: t.TempDir()}
	var err error
	f.store, err = artifact.OpenStore(filepath.Join(f.dir, "artifacts"), artifact.Options{})
	require.NoError(t, err)
	f.heads, err = chain.OpenStore(filepath.Join(f.dir, "heads"))
	require.NoError(t, err)
	f.tips = newTips(f.heads, nil, 1)
	f.restart(keep)
	f.data = f.put("dataset file")
	f.p.setDataset([]cid.Cid{f.data})
	return f
}

// restart makes a new pruner on the same directories, as a restarted node does.
func (f *pruneFixture) restart(keep int) {
	f.p = newPruner(f.store, f.heads, f.tips, keep, f.dir, newNodeMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	if f.data.Defined() {
		f.p.setDataset([]cid.Cid{f.data})
	}
}

func (f *pruneFixture) put(s string) cid.Cid {
	id, err := f.store.PutBytes([]byte(s))
	require.NoError(f.t, err)
	return id
}

// round makes head r canonical and sweeps.
func (f *pruneFixture) round(r uint64, kept ...*checkpoint.State) sweepResult {
	f.t.Helper()
	p, o := f.put(fmt.Sprint("params ", r)), f.put(fmt.Sprint("outer ", r))
	c, s := f.put(fmt.Sprint("contribution ", r)), f.put(fmt.Sprint("stray delta ", r))
	f.params, f.outer, f.contrib, f.stray = append(f.params, p), append(f.outer, o), append(f.contrib, c), append(f.stray, s)
	h := &chain.Head{Version: 1, Network: "n", Experiment: "e", Round: r, Params: p.Bytes(), OuterState: o.Bytes(), LayoutHash: strings.Repeat("ab", 32),
		Contributions: []chain.Contribution{{Peer: "p", Artifact: c.Bytes(), Samples: 1, Weight: 1}},
		Policy:        chain.Policy{Kind: "diloco", Aggregator: "mean", Codec: "fp32"},
		Ledger:        chain.Ledger{Plan: "p", Shards: 1, Consumed: []byte{0}}}
	if f.parent.Defined() {
		h.Parent = f.parent.Bytes()
	}
	b, err := h.Encode()
	require.NoError(f.t, err)
	sh, err := f.heads.Put(&chain.SignedHead{Head: b})
	require.NoError(f.t, err)
	f.parent = sh.ID()
	f.tips.Restore(sh.ID(), h)
	res, err := f.p.sweep(r, kept)
	require.NoError(f.t, err)
	return res
}

func (f *pruneFixture) requireHeld(what string, ids []cid.Cid, rounds ...int) {
	f.t.Helper()
	for r, id := range ids {
		require.Equal(f.t, slices.Contains(rounds, r), f.store.Has(id), "%s of round %d", what, r)
	}
}

// The sweep keeps the newest K heads' parameters, outer state and contributions, what a
// kept checkpoint generation references, the dataset, and anything newer than K rounds;
// it deletes the rest. A restart (or a lost retention record) never deletes early, and a
// blob a crash left without its manifest is removed.
func TestSweepKeepsWhatTheChainNeeds(t *testing.T) {
	f := newPruneFixture(t, 2)
	for r := uint64(0); r <= 4; r++ {
		f.round(r)
	}
	f.requireHeld("params", f.params, 3, 4)
	f.requireHeld("outer state", f.outer, 3, 4)
	f.requireHeld("contribution", f.contrib, 3, 4)
	f.requireHeld("stray delta", f.stray, 3, 4)
	require.True(t, f.store.Has(f.data))

	// A kept checkpoint generation pins the head it names.
	ck := &checkpoint.State{Round: 3, Refs: map[string]cid.Cid{refHeadParams: f.params[3], refHeadOuter: f.outer[3]}}
	res := f.round(5, ck)
	require.Equal(t, 2, res.Removed, "round 3's contribution and stray delta")
	f.requireHeld("params", f.params, 3, 4, 5)
	f.requireHeld("outer state", f.outer, 3, 4, 5)
	f.requireHeld("contribution", f.contrib, 4, 5)

	// Crash between the two removals of a deletion: the blob is left without a manifest.
	orphan := f.stray[4]
	require.NoError(t, os.Remove(filepath.Join(f.dir, "artifacts", "manifests", orphan.String())))
	require.FileExists(t, f.store.BlobPath(orphan))
	// And the retention record is lost: every artifact counts as new after the restart.
	require.NoError(t, os.Remove(filepath.Join(f.dir, RetentionFile)))
	f.restart(2)
	f.round(6)
	require.NoFileExists(t, f.store.BlobPath(orphan))
	f.requireHeld("params", f.params, 3, 4, 5, 6)
	f.round(7)
	f.requireHeld("params", f.params, 3, 4, 5, 6, 7)
	f.round(8)
	f.requireHeld("params", f.params, 7, 8)
	f.requireHeld("contribution", f.contrib, 7, 8)
	f.requireHeld("stray delta", f.stray, 7, 8)
	require.True(t, f.store.Has(f.data))

	// An artifact committed again while the sweep decides (a trainer re-encoding the same
	// bytes) is not deleted by that sweep.
	again := f.put("params 7")
	require.Equal(t, f.params[7], again)
	f.round(9)
	f.round(10)
	require.True(t, f.store.Has(f.params[7]), "re-committed at round 8, so kept until round 10")
	f.round(11)
	require.False(t, f.store.Has(f.params[7]))

	// A download every caller abandoned leaves partial files; they go K rounds after the
	// pruner first saw them.
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	h, err := mn.GenPeer()
	require.NoError(t, err)
	x := artifact.NewExchange(h, f.store, artifact.ExchangeOptions{})
	t.Cleanup(func() { x.Close() })
	f.p.setPartials(x.RemoveIdlePartials)
	abandoned := f.put("abandoned download")
	require.True(t, f.store.Has(abandoned))
	var files []string
	for _, ext := range []string{".manifest", ".data", ".have"} {
		path := filepath.Join(f.dir, "artifacts", "partial", abandoned.String()+ext)
		require.NoError(t, os.WriteFile(path, []byte("partial state"), 0o644))
		files = append(files, path)
	}
	f.round(12)
	f.round(13)
	for _, path := range files {
		require.FileExists(t, path)
	}
	f.round(14)
	for _, path := range files {
		require.NoFileExists(t, path)
	}
}
