package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/dataset"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/export"
	"github.com/p2pnode/p2pnode/upkeep"
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

// With node.keep_heads K, a node's store after many rounds holds K heads' parameters, the
// tip's contributions (a trainer: its own) and on a validator the tip's outer state,
// whatever the number of rounds: (K + 1 + T) × the model's bytes of artifacts on a
// validator with T trainers and the fp32 codec, and within (K + 3) × the model's bytes
// plus the dataset on a trainer. A peer asking for a pruned artifact is told it is gone at
// once, the chain's heads stay available, and audit and export still work on the pruned
// store.
//
// P2PNODE_PRUNE_ROUNDS, P2PNODE_PRUNE_PAD and P2PNODE_PRUNE_ARCHIVE=1 measure other runs
// (the figure in docs/storage.md: 200 rounds).
func TestStoreIsPrunedToKeepHeads(t *testing.T) {
	codecs := []string{"fp32", "sparse"}
	if s := os.Getenv("P2PNODE_PRUNE_CODEC"); s != "" {
		codecs = []string{s}
	}
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) { testStoreIsPrunedToKeepHeads(t, codec) })
	}
}

func testStoreIsPrunedToKeepHeads(t *testing.T, codec string) {
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
		n.cfg.Protocol.Codec = diloco.Codec(codec)
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

	t.Logf("model %d bytes (fp32 pack), dataset %d bytes, keep_heads %d, archive %v, codec %s, %d rounds", model, data, keep, archive, codec, rounds)
	oid, err := heads[len(heads)-1].OuterStateID()
	require.NoError(t, err)
	om, err := stores.Artifacts.Manifest(oid)
	require.NoError(t, err)
	outer := int64(om.Size)          // the momentum pack's header is not the params pack's
	tipContribs := codec == "sparse" // what the pruner keeps of the tip's contributions
	var contribBytes int64
	if tipContribs {
		for _, ct := range heads[len(heads)-1].Contributions {
			id, err := cid.Cast(ct.Artifact)
			require.NoError(t, err)
			m, err := stores.Artifacts.Manifest(id)
			require.NoError(t, err)
			contribBytes += int64(m.Size)
		}
	}
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
		inFlight, older, anchor := requirePrunedTo(t, n.cfg, n.host.ID().String(), heads, keep, n == val, tipContribs)
		// What the rule keeps between rounds: K parameter packs, the tip's outer state (a
		// validator, or a trainer that rebuilds heads) and on the sparse codec the tip's
		// contributions, older rounds' up to one pack and the anchor's parameters and outer
		// state, besides the dataset, the artifacts' manifests and the work of the round
		// open when the node stopped. The small records (heads, checkpoint, history) are
		// outside the artifact store.
		require.LessOrEqual(t, older, model, "%s: older rounds' contributions beyond one pack", n.name)
		if older > 0 {
			t.Logf("%s: %d bytes of older rounds' contributions", n.name, older)
		}
		bound := int64(keep)*model + outer + contribBytes + older + anchor + inFlight + data + storeBytes(t, filepath.Join(n.cfg.Node.StoreDir, "artifacts", "manifests"))
		if inFlight > 0 {
			t.Logf("%s: %d bytes of the open round's work", n.name, inFlight)
		}
		if arts > bound {
			for _, sub := range []string{"blobs", "manifests", "partial", "tmp"} {
				t.Logf("%s: artifacts/%s %d bytes", n.name, sub, storeBytes(t, filepath.Join(n.cfg.Node.StoreDir, "artifacts", sub)))
			}
		}
		require.LessOrEqual(t, arts, bound, "%s: %d bytes of artifacts after %d rounds", n.name, arts, rounds)
		if codec == "sparse" {
			// A trainer's checkpoint holds its error-feedback residual (one model) and the
			// workload's inner-optimizer state on top: the figure below is fp32's.
			continue
		}
		require.LessOrEqual(t, total, int64(keep+3)*model+data, "%s: %d bytes on disk after %d rounds", n.name, total, rounds)
	}
}

// requirePrunedTo checks the artifacts a stopped node (peer id self) holds against the
// rule: the newest K heads' parameters, the tip's outer state (a validator), if
// tipContribs the tip's contributions (all of them on a validator, its own on a
// trainer) and the older rounds' it holds, newest first, while they add up to one
// parameter pack, and the anchor's parameters and outer state (upkeep.AnchorEvery), the
// dataset, and nothing else but work first seen at the final round (retention.json). It
// returns the bytes of that work (in flight when the node stopped), of the older rounds'
// contributions and of the anchor's artifacts where they are not the tip's or a kept head's.
func requirePrunedTo(t *testing.T, cfg *config.Config, self string, chainHeads []*chain.Head, keep int, validator, tipContribs bool) (inFlight, older, anchor int64) {
	t.Helper()
	stores, err := OpenStores(cfg)
	require.NoError(t, err)
	held, err := stores.Artifacts.List()
	require.NoError(t, err)
	tip := chainHeads[len(chainHeads)-1]
	named := map[cid.Cid]string{}
	for _, h := range chainHeads[len(chainHeads)-keep:] {
		id, err := h.ParamsID()
		require.NoError(t, err)
		named[id] = fmt.Sprintf("round %d's parameters", h.Round)
	}
	required := maps.Clone(named)
	if validator {
		id, err := tip.OuterStateID()
		require.NoError(t, err)
		required[id] = fmt.Sprintf("round %d's outer state", tip.Round)
	}
	if validator || tipContribs { // trainers that rebuild heads keep it too
		id, err := tip.OuterStateID()
		require.NoError(t, err)
		named[id] = fmt.Sprintf("round %d's outer state", tip.Round)
	}
	for _, c := range tip.Contributions {
		if !tipContribs {
			break // pruned once the tip is canonical: held only if first seen at its round
		}
		id, err := cid.Cast(c.Artifact)
		require.NoError(t, err)
		named[id] = fmt.Sprintf("round %d's contribution by %s", tip.Round, c.Peer)
		if validator || c.Peer == self {
			required[id] = named[id]
		}
	}
	if tipContribs {
		pid, err := tip.ParamsID()
		require.NoError(t, err)
		pm, err := stores.Artifacts.Manifest(pid)
		require.NoError(t, err)
		older = olderContributions(t, stores.Artifacts, chainHeads[:len(chainHeads)-1], int64(pm.Size), named)
		a := chainHeads[tip.Round/upkeep.AnchorEvery*upkeep.AnchorEvery]
		for _, get := range []func() (cid.Cid, error){a.ParamsID, a.OuterStateID} {
			id, err := get()
			require.NoError(t, err)
			if _, ok := named[id]; ok || !stores.Artifacts.Has(id) {
				continue
			}
			named[id] = fmt.Sprintf("round %d's artifact (the anchor's)", a.Round)
			m, err := stores.Artifacts.Manifest(id)
			require.NoError(t, err)
			anchor += int64(m.Size)
		}
	}
	// The reference update the tip was screened with (a validator that trains one) is kept
	// for the next round's screening. It is trained while the round is open, so the
	// pruner first saw it at the tip's round or, when the previous round's sweep ran after
	// it was stored, at the round before: it counts with the work in flight.
	if ref, err := tip.ReferenceID(); err == nil && ref.Defined() && stores.Artifacts.Has(ref) {
		named[ref] = fmt.Sprintf("round %d's reference update", tip.Round)
		m, err := stores.Artifacts.Manifest(ref)
		require.NoError(t, err)
		inFlight += int64(m.Size)
	}
	m, err := dataset.Load(cfg.Dataset.Manifest)
	require.NoError(t, err)
	data, err := m.CIDs()
	require.NoError(t, err)
	seen := map[string]uint64{}
	if b, err := os.ReadFile(filepath.Join(cfg.Node.StoreDir, upkeep.RetentionFile)); err == nil {
		require.NoError(t, json.Unmarshal(b, &seen))
	}
	for id, what := range required {
		require.True(t, stores.Artifacts.Has(id), "%s: %s was pruned", cfg.Node.StoreDir, what)
	}
	for _, id := range held {
		if _, ok := named[id]; ok || slices.ContainsFunc(data, id.Equals) {
			continue
		}
		r, ok := seen[id.String()]
		require.True(t, ok && r == tip.Round, "%s holds artifact %s, which no kept head names, first seen at round %d (tip %d)",
			cfg.Node.StoreDir, id, r, tip.Round)
		m, err := stores.Artifacts.Manifest(id)
		require.NoError(t, err)
		inFlight += int64(m.Size)
	}
	return inFlight, older, anchor
}

// olderContributions names in named the contributions of heads (oldest first, the tip's
// parent last) that store holds, round by round from the newest, while they add up to
// no more than pack bytes, and returns their bytes.
func olderContributions(t *testing.T, store *artifact.Store, heads []*chain.Head, pack int64, named map[cid.Cid]string) int64 {
	t.Helper()
	var kept int64
	for i := len(heads) - 1; i >= 0; i-- {
		h := heads[i]
		var round int64
		held := map[cid.Cid]string{}
		for _, c := range h.Contributions {
			id, err := cid.Cast(c.Artifact)
			require.NoError(t, err)
			if m, err := store.Manifest(id); err == nil {
				round += int64(m.Size)
				held[id] = fmt.Sprintf("round %d's contribution by %s", h.Round, c.Peer)
			}
		}
		if kept+round > pack {
			break
		}
		kept += round
		maps.Copy(named, held)
	}
	return kept
}
