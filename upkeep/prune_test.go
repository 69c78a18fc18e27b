package upkeep

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/checkpoint"
	"github.com/p2pnode/p2pnode/cids"
)

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
	tips    *chain.Tips
	p       *Pruner
	data    cid.Cid
	params  []cid.Cid
	outer   []cid.Cid
	contrib []cid.Cid
	stray   []cid.Cid
	parent  cid.Cid
	// tipContribs is the pruner's: the fixture's pruner keeps the tip's contributions (the
	// sparse codec) unless a test says otherwise.
	tipContribs bool
}

func newPruneFixture(t *testing.T, keep int) *pruneFixture {
	t.Helper()
	f := &pruneFixture{t: t, dir: t.TempDir(), tipContribs: true}
	var err error
	f.store, err = artifact.OpenStore(filepath.Join(f.dir, "artifacts"), artifact.Options{ChunkSize: 1 << 12})
	require.NoError(t, err)
	f.heads, err = chain.OpenStore(filepath.Join(f.dir, "heads"))
	require.NoError(t, err)
	f.tips = chain.NewTips(f.heads, nil, 1)
	f.restart(keep)
	f.data = f.put("dataset file")
	f.p.SetDataset([]cid.Cid{f.data})
	return f
}

// restart makes a new pruner on the same directories, as a restarted node does.
func (f *pruneFixture) restart(keep int) {
	f.p = NewPruner(f.store, f.heads, f.tips, keep, f.tipContribs, f.dir, testCounters(), slog.New(slog.DiscardHandler))
	if f.data.Defined() {
		f.p.SetDataset([]cid.Cid{f.data})
	}
}

func (f *pruneFixture) put(s string) cid.Cid {
	id, err := f.store.PutBytes([]byte(s))
	require.NoError(f.t, err)
	return id
}

// head makes a head of round r canonical that names params, outer and contribs.
func (f *pruneFixture) head(r uint64, params, outer cid.Cid, contribs ...cid.Cid) {
	f.t.Helper()
	h := &chain.Head{Version: 1, Network: "n", Experiment: "e", Round: r, Params: params.Bytes(), OuterState: outer.Bytes(), LayoutHash: strings.Repeat("ab", 32),
		Policy: chain.Policy{Kind: "diloco", Aggregator: "mean", Codec: "fp32"},
		Ledger: chain.Ledger{Plan: "p", Shards: 1, Consumed: []byte{0}}}
	for i, c := range contribs {
		h.Contributions = append(h.Contributions, chain.Contribution{Peer: fmt.Sprint("peer ", i), Artifact: c.Bytes(), Samples: 1, Weight: 1})
	}
	if f.parent.Defined() {
		h.Parent = f.parent.Bytes()
	}
	b, err := h.Encode()
	require.NoError(f.t, err)
	sh, err := f.heads.Put(&chain.SignedHead{Head: b})
	require.NoError(f.t, err)
	f.parent = sh.ID()
	f.tips.Restore(sh.ID(), h)
}

// next makes head r canonical with fresh artifacts: its parameters, outer state and
// contribution, and a stray delta no head names. The contribution is larger than the
// parameters, so no older round's fits in the pack the sparse codec keeps them within
// (TestSweepKeepsOlderContributionsWithinAPack sizes them).
func (f *pruneFixture) next(r uint64) {
	f.t.Helper()
	p, o := f.put(fmt.Sprint("params ", r)), f.put(fmt.Sprint("outer ", r))
	c, s := f.put(fmt.Sprint("contribution ", r)), f.put(fmt.Sprint("stray delta ", r))
	f.params, f.outer, f.contrib, f.stray = append(f.params, p), append(f.outer, o), append(f.contrib, c), append(f.stray, s)
	f.head(r, p, o, c)
}

func (f *pruneFixture) sweep(r uint64, kept ...*checkpoint.State) sweepResult {
	f.t.Helper()
	res, err := f.p.sweep(r, kept)
	require.NoError(f.t, err)
	return res
}

// round makes head r canonical and sweeps, with validator checkpoint generations at the
// heads of the rounds gens names (newest first).
func (f *pruneFixture) round(r uint64, gens ...uint64) sweepResult {
	f.t.Helper()
	f.next(r)
	return f.sweep(r, f.gens(gens...)...)
}

// gens is validator checkpoint generations at the given rounds' heads.
func (f *pruneFixture) gens(rounds ...uint64) []*checkpoint.State {
	var kept []*checkpoint.State
	for _, r := range rounds {
		kept = append(kept, f.gen(r, true))
	}
	return kept
}

// gen is a checkpoint generation at head r, as the keeper writes it: the head's
// parameters, and its outer state when withOuter (a validator).
func (f *pruneFixture) gen(r uint64, withOuter bool) *checkpoint.State {
	refs := map[string]cid.Cid{refHeadParams: f.params[r]}
	if withOuter {
		refs[refHeadOuter] = f.outer[r]
	}
	return &checkpoint.State{Seq: r + 1, Round: r, Head: fmt.Sprint("head ", r), Refs: refs}
}

func (f *pruneFixture) requireHeld(what string, ids []cid.Cid, rounds ...int) {
	f.t.Helper()
	for r, id := range ids {
		require.Equal(f.t, slices.Contains(rounds, r), f.store.Has(id), "%s of round %d", what, r)
	}
}

// After many rounds the store holds exactly: the newest K heads' parameters, the outer
// state of the tip (and of the heads newer than the newest checkpoint generation, which a
// queued snapshot may name), the tip's contributions (on the sparse codec, whose trainers
// rebuild heads from them; on the others not even when they arrived after the previous
// sweep), what the newest generation names,
// the parameters older generations name, the work of the last round no head names, and
// the dataset. The rule before it kept K heads' outer state and K rounds of contributions
// and stray deltas.
func TestSweepKeepsWhatTheChainNeeds(t *testing.T) {
	const last = 6
	tests := []struct {
		name string
		keep int
		// gens is how many generations the checkpoint keeps (min(K, 3)); lag how many heads
		// the newest one is behind the tip (its writer is slow); outer whether they name
		// the outer state (a validator's).
		gens, lag int
		outer     bool
		// fp32: the pruner does not keep the tip's contributions (no trainer rebuilds
		// heads); the other rows are on the sparse codec.
		fp32 bool
		// Rounds whose artifacts are held after round last (on the sparse codec round 0's
		// parameters and outer state: genesis is the anchor until round AnchorEvery).
		params, outerHeld, contrib, stray []int
	}{
		{name: "validator K=2", keep: 2, gens: 2, outer: true,
			params: []int{0, 5, 6}, outerHeld: []int{0, 6}, contrib: []int{6}, stray: []int{6}},
		{name: "validator K=3", keep: 3, gens: 3, outer: true,
			params: []int{0, 4, 5, 6}, outerHeld: []int{0, 6}, contrib: []int{6}, stray: []int{6}},
		{name: "validator K=5", keep: 5, gens: 3, outer: true,
			params: []int{0, 2, 3, 4, 5, 6}, outerHeld: []int{0, 6}, contrib: []int{6}, stray: []int{6}},
		{name: "validator K=2, fp32", keep: 2, gens: 2, outer: true, fp32: true,
			params: []int{5, 6}, outerHeld: []int{6}, contrib: nil, stray: []int{6}},
		{name: "trainer K=2, fp32", keep: 2, gens: 2, outer: false, fp32: true,
			params: []int{5, 6}, outerHeld: []int{6}, contrib: nil, stray: []int{6}},
		{name: "trainer K=2", keep: 2, gens: 2, outer: false,
			params: []int{0, 5, 6}, outerHeld: []int{0, 6}, contrib: []int{6}, stray: []int{6}},
		{name: "validator K=2, checkpoint one head behind", keep: 2, gens: 2, lag: 1, outer: true,
			params: []int{0, 4, 5, 6}, outerHeld: []int{0, 5, 6}, contrib: []int{6}, stray: []int{6}},
		{name: "validator K=2, checkpoint two heads behind", keep: 2, gens: 2, lag: 2, outer: true,
			params: []int{0, 3, 4, 5, 6}, outerHeld: []int{0, 4, 5, 6}, contrib: []int{6}, stray: []int{6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newPruneFixture(t, tt.keep)
			f.tipContribs = !tt.fp32
			f.restart(tt.keep)
			for r := uint64(0); r <= last; r++ {
				f.next(r)
				var kept []*checkpoint.State // newest first, as checkpoint.AfterPrune gives them
				for g := range tt.gens {
					if at := int(r) - tt.lag - g; at >= 0 {
						kept = append(kept, f.gen(uint64(at), tt.outer))
					}
				}
				f.sweep(r, kept...)
			}
			f.requireHeld("params", f.params, tt.params...)
			f.requireHeld("outer state", f.outer, tt.outerHeld...)
			f.requireHeld("contribution", f.contrib, tt.contrib...)
			f.requireHeld("stray delta", f.stray, tt.stray...)
			ids, err := f.store.List()
			require.NoError(t, err)
			require.Len(t, ids, 1+len(tt.params)+len(tt.outerHeld)+len(tt.contrib)+len(tt.stray), "the dataset and the artifacts above, nothing else")
			require.True(t, f.store.Has(f.data))
		})
	}
}

// On the sparse codec the contributions of the rounds before the tip are kept, newest
// first and whole rounds only, while the held ones add up to no more than the tip's
// parameter pack, and for at most ContribRounds rounds: a node whose download of a head
// took several rounds rebuilds the heads that came meanwhile from them. The anchor's
// parameters and outer state are kept too (AnchorEvery), found however far back the
// contributions end. The other codecs keep none of them.
func TestSweepKeepsOlderContributionsWithinAPack(t *testing.T) {
	tests := []struct {
		name string
		// A pack of params bytes; each round merges contribs contributions of size bytes.
		params, size, contribs int
		rounds                 uint64
		fp32                   bool
		// held is the rounds whose contributions are held after the last round's sweep.
		held []int
	}{
		{name: "three rounds fit", params: 100, size: 30, contribs: 1, rounds: 8, held: []int{5, 6, 7, 8}},
		{name: "a round of two fits once", params: 100, size: 30, contribs: 2, rounds: 8, held: []int{7, 8}},
		{name: "exactly one pack", params: 90, size: 30, contribs: 1, rounds: 8, held: []int{5, 6, 7, 8}},
		{name: "none fits: the tip's alone", params: 100, size: 101, contribs: 1, rounds: 8, held: []int{8}},
		{name: "at most ContribRounds rounds", params: 1 << 12, size: 24, contribs: 1, rounds: ContribRounds + 6,
			held: rangeInts(6, ContribRounds+6)},
		{name: "fp32 keeps none", params: 100, size: 30, contribs: 1, rounds: 8, fp32: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newPruneFixture(t, 2)
			f.tipContribs = !tt.fp32
			f.restart(2)
			sized := func(n int, what string, r uint64, i int) cid.Cid {
				b := []byte(fmt.Sprintf("%s %d %d ", what, r, i))
				return f.put(string(append(b, bytes.Repeat([]byte{'.'}, n-len(b))...)))
			}
			byRound := map[int][]cid.Cid{}
			for r := uint64(0); r <= tt.rounds; r++ {
				var cs []cid.Cid
				for i := range tt.contribs {
					cs = append(cs, sized(tt.size, "contribution", r, i))
				}
				byRound[int(r)] = cs
				p, o := sized(tt.params, "params", r, 0), sized(tt.params, "outer", r, 0)
				f.params, f.outer = append(f.params, p), append(f.outer, o)
				f.head(r, p, o, cs...)
				f.sweep(r, f.gens(r)...)
			}
			for r, cs := range byRound {
				for _, c := range cs {
					require.Equal(t, slices.Contains(tt.held, r), f.store.Has(c), "round %d's contribution", r)
				}
			}
			anchor := -1 // the anchor's artifacts are kept on the sparse codec
			if !tt.fp32 {
				anchor = int(tt.rounds / AnchorEvery * AnchorEvery)
			}
			f.requireHeld("params", f.params, int(tt.rounds)-1, int(tt.rounds), anchor)
			f.requireHeld("outer state", f.outer, int(tt.rounds), anchor)
		})
	}
}

// rangeInts is from, from+1, ..., to.
func rangeInts(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// Work of the open round — contributions arriving, a delta being encoded, the merge
// output of a proposal not yet at quorum, the artifacts of the next head fetched by a node
// one head behind — is kept by every sweep at the tip's round, however late the
// checkpoint that triggers it; once the next head is canonical, what it names stays with
// it (its contributions only on the sparse codec) and the rest goes one round after it
// was first seen.
func TestSweepSparesTheOpenRound(t *testing.T) {
	type when int
	const (
		// beforeSweep: committed after the base head became canonical, before the sweep
		// of its checkpoint (the writer was slow); afterSweep: after that sweep.
		beforeSweep when = iota
		afterSweep
	)
	tests := []struct {
		name  string
		when  when
		named string // what head 4 names it as: "params", "outer", "contribution" or ""
		// Held after the sweep at round 4 and at round 5 (after a late sweep at round 3:
		// always held).
		at4, at5 bool
	}{
		{"contribution merged by the next head", beforeSweep, "contribution", true, false},
		{"contribution merged by the next head, arrived after the sweep", afterSweep, "contribution", true, false},
		{"contribution not merged (rejected or late)", beforeSweep, "", false, false},
		{"contribution not merged, arrived after the sweep", afterSweep, "", false, false},
		{"delta being encoded, merged", afterSweep, "contribution", true, false},
		{"merge output: parameters of the proposal that reached quorum", beforeSweep, "params", true, true},
		{"merge output: outer state of the proposal that reached quorum", beforeSweep, "outer", true, false},
		{"merge output of a proposal that lost", beforeSweep, "", false, false},
	}
	for _, tc := range []struct {
		keep   int
		sparse bool // the pruner keeps the tip's contributions (trainers rebuild from them)
	}{{2, true}, {3, true}, {2, false}} {
		t.Run(fmt.Sprintf("K=%d sparse=%v", tc.keep, tc.sparse), func(t *testing.T) {
			keep := tc.keep
			f := newPruneFixture(t, keep)
			f.tipContribs = tc.sparse
			f.restart(keep)
			for r := uint64(0); r <= 2; r++ {
				f.round(r, r)
			}
			f.next(3) // head 3 canonical, round 4 open
			ids := make([]cid.Cid, len(tests))
			for i, tt := range tests {
				if tt.when == beforeSweep {
					ids[i] = f.put(tt.name)
				}
			}
			f.sweep(3, f.gens(3, 2)...)
			for i, tt := range tests {
				if tt.when == afterSweep {
					ids[i] = f.put(tt.name)
				}
			}
			// A checkpoint of round 3 written late, and one of round 2 later still: both
			// sweep at round 3 at most.
			f.sweep(3, f.gens(3, 2)...)
			f.sweep(2, f.gens(3, 2)...)
			for i, tt := range tests {
				require.True(t, f.store.Has(ids[i]), "%s deleted while its round was open", tt.name)
			}

			var params, outer cid.Cid
			var contribs []cid.Cid
			for i, tt := range tests {
				switch tt.named {
				case "params":
					params = ids[i]
				case "outer":
					outer = ids[i]
				case "contribution":
					contribs = append(contribs, ids[i])
				}
			}
			f.params, f.outer = append(f.params, params), append(f.outer, outer)
			f.head(4, params, outer, contribs...)
			f.sweep(4, f.gens(4, 3)...)
			for i, tt := range tests {
				// Without rebuilding trainers the next head's contributions go with it.
				want := tt.at4 && (tc.sparse || tt.named != "contribution")
				require.Equal(t, want, f.store.Has(ids[i]), "after head 4: %s", tt.name)
			}
			f.round(5, 5, 4)
			for i, tt := range tests {
				require.Equal(t, tt.at5, f.store.Has(ids[i]), "after head 5: %s", tt.name)
			}
		})
	}
}

// Without rebuilding trainers (fp32, fp16, int8) the tip's contributions stay while a
// validator may still verify the tip's proposal — not every validator has signed it, as
// far as this node has seen — and go at the first sweep after the last signature.
func TestSweepKeepsContributionsUntilEveryValidatorSigned(t *testing.T) {
	f := newPruneFixture(t, 2)
	f.tipContribs = false
	f.restart(2)
	var keys []crypto.PrivKey
	var ids []string
	for range 3 {
		k, _, err := crypto.GenerateEd25519Key(rand.Reader)
		require.NoError(t, err)
		id, err := peer.IDFromPrivateKey(k)
		require.NoError(t, err)
		keys, ids = append(keys, k), append(ids, id.String())
	}
	f.tips = chain.NewTips(f.heads, ids, 1) // the validators whose signatures the sweep waits for
	f.restart(2)
	sign := func(i int) {
		sh, _, err := f.heads.Get(f.parent)
		require.NoError(t, err)
		sig, err := chain.Sign(keys[i], f.parent)
		require.NoError(t, err)
		sh.Add(sig)
		_, err = f.heads.Put(sh)
		require.NoError(t, err)
	}
	for r := uint64(0); r <= 2; r++ {
		f.round(r, r)
	}
	// Round 3's contribution arrives while head 2 is the tip, before its sweep.
	c := f.put("contribution 3")
	f.sweep(2, f.gens(2, 1)...)
	p, o := f.put("params 3"), f.put("outer 3")
	f.params, f.outer, f.contrib = append(f.params, p), append(f.outer, o), append(f.contrib, c)
	f.head(3, p, o, c)
	sign(0)
	sign(1) // a quorum of two: canonical, the third validator may be verifying still
	f.sweep(3, f.gens(3, 2)...)
	require.True(t, f.store.Has(c), "deleted while a validator had not signed the tip")
	sign(1) // the same signature again counts once
	f.sweep(3, f.gens(3, 2)...)
	require.True(t, f.store.Has(c), "deleted while a validator had not signed the tip")
	sign(2)
	f.sweep(3, f.gens(3, 2)...)
	require.False(t, f.store.Has(c), "kept after every validator signed the tip")
	f.requireHeld("params", f.params, 2, 3)
	f.requireHeld("outer state", f.outer, 3)
}

// A node one head behind fetches the next head's parameters, outer state and
// contributions (to verify a proposal, or to sync the head) while its own tip is still the
// older one; its sweeps keep them, and once the head is canonical here too it names them.
func TestSweepSparesTheHeadBeingSynced(t *testing.T) {
	f := newPruneFixture(t, 2)
	for r := uint64(0); r <= 3; r++ {
		f.round(r, r)
	}
	p, o, c := f.put("params 4"), f.put("outer 4"), f.put("contribution 4")
	for range 3 {
		f.sweep(3, f.gens(3, 2)...)
	}
	for _, id := range []cid.Cid{p, o, c} {
		require.True(t, f.store.Has(id))
	}
	f.params, f.outer, f.contrib = append(f.params, p), append(f.outer, o), append(f.contrib, c)
	f.head(4, p, o, c)
	f.sweep(4, f.gens(4, 3)...)
	f.requireHeld("params", f.params, 0, 3, 4) // round 0's: the anchor
	f.requireHeld("outer state", f.outer, 0, 4)
	f.requireHeld("contribution", f.contrib, 4)
}

// A restart (or a lost retention record) never deletes early, a blob a crash left without
// its manifest is removed, and an artifact committed again while it was due is kept one
// more round.
func TestSweepAfterARestart(t *testing.T) {
	f := newPruneFixture(t, 2) // sparse: round 0's parameters and outer state are the anchor's
	for r := uint64(0); r <= 4; r++ {
		f.round(r, r)
	}
	f.requireHeld("params", f.params, 0, 3, 4)
	f.requireHeld("outer state", f.outer, 0, 4)
	f.requireHeld("stray delta", f.stray, 4)

	// Crash between the two removals of a deletion: the blob is left without a manifest.
	orphan := f.stray[4]
	require.NoError(t, os.Remove(filepath.Join(f.dir, "artifacts", "manifests", orphan.String())))
	require.FileExists(t, f.store.BlobPath(orphan))
	// And the retention record is lost: every artifact counts as new after the restart.
	require.NoError(t, os.Remove(filepath.Join(f.dir, RetentionFile)))
	f.restart(2)
	f.round(5, 5, 4)
	require.NoFileExists(t, f.store.BlobPath(orphan))
	f.requireHeld("params", f.params, 0, 3, 4, 5)
	f.requireHeld("outer state", f.outer, 0, 4, 5)
	f.requireHeld("contribution", f.contrib, 4, 5)
	f.round(6, 6, 5)
	f.requireHeld("params", f.params, 0, 5, 6)
	f.requireHeld("outer state", f.outer, 0, 6)
	f.requireHeld("contribution", f.contrib, 6)
	f.requireHeld("stray delta", f.stray, 6)
	require.True(t, f.store.Has(f.data))

	// The retention record survives a plain restart: round 6's stray delta is due at 7.
	f.restart(2)
	f.round(7, 7, 6)
	f.requireHeld("stray delta", f.stray, 7)

	// An artifact committed again while the sweep decides (a trainer re-encoding the same
	// bytes) is not deleted by that sweep.
	again := f.put("params 6")
	require.Equal(t, f.params[6], again)
	f.round(8, 8, 7)
	require.True(t, f.store.Has(f.params[6]), "re-committed at round 7, so first seen at 8 and kept through it")
	f.round(9, 9, 8)
	require.False(t, f.store.Has(f.params[6]))
}

// The partial files of an abandoned download go a round after the pruner first saw them,
// unless they are of an artifact the node keeps (a kept head's parameters, which a later
// fetch resumes). A download in progress keeps its partial files whatever its age.
func TestSweepRemovesAbandonedDownloads(t *testing.T) {
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	f := newPruneFixture(t, 2)
	h, err := mn.GenPeer()
	require.NoError(t, err)
	x := artifact.NewExchange(h, f.store, artifact.ExchangeOptions{})
	t.Cleanup(func() { x.Close() })
	f.p.SetPartials(x.RemoveIdlePartials)
	for r := uint64(0); r <= 2; r++ {
		f.round(r, r)
	}
	partial := func(id cid.Cid) []string {
		var files []string
		for _, ext := range []string{".manifest", ".data", ".have"} {
			files = append(files, filepath.Join(f.dir, "artifacts", "partial", id.String()+ext))
		}
		return files
	}
	// Ids of artifacts this store does not hold; the next head names the first.
	nextParams := cids.Record([]byte("params 3, not fetched yet"))
	abandoned := cids.Record([]byte("a contribution whose trainer vanished"))
	for _, id := range []cid.Cid{nextParams, abandoned} {
		for _, path := range partial(id) {
			require.NoError(t, os.WriteFile(path, []byte("partial state"), 0o644))
		}
	}
	f.sweep(2, f.gens(2, 1)...) // first seen at round 2
	f.params, f.outer = append(f.params, nextParams), append(f.outer, f.put("outer 3"))
	f.head(3, nextParams, f.outer[3])
	f.sweep(3, f.gens(2, 1)...)
	for _, path := range partial(abandoned) {
		require.NoFileExists(t, path)
	}
	for _, path := range partial(nextParams) {
		require.FileExists(t, path, "a kept head's parameters, partly downloaded")
	}
	f.round(4, 2, 1)
	f.round(5, 2, 1)
	for _, path := range partial(nextParams) {
		require.NoFileExists(t, path, "head 3 is no longer kept")
	}

	// A download in progress: a slow link, two rounds while it runs.
	src, err := mn.GenPeer()
	require.NoError(t, err)
	srcStore, err := artifact.OpenStore(t.TempDir(), artifact.Options{ChunkSize: 1 << 12})
	require.NoError(t, err)
	sx := artifact.NewExchange(src, srcStore, artifact.ExchangeOptions{})
	t.Cleanup(func() { sx.Close() })
	big := make([]byte, 256<<10)
	for i := range big {
		big[i] = byte(i * 7)
	}
	id, err := srcStore.PutBytes(big)
	require.NoError(t, err)
	mn.SetLinkDefaults(mocknet.LinkOptions{Bandwidth: 64 << 10})
	require.NoError(t, mn.LinkAll())
	_, err = mn.ConnectPeers(h.ID(), src.ID())
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done <- x.Fetch(ctx, id, src.ID())
	}()
	require.Eventually(t, func() bool {
		_, err := os.Stat(partial(id)[1])
		return err == nil
	}, 30*time.Second, 10*time.Millisecond, "the download did not start")
	f.round(6, 6, 5)
	f.round(7, 7, 6)
	select {
	case err := <-done:
		t.Fatalf("the download ended before the sweeps ran (%v): make the link slower", err)
	default:
	}
	require.FileExists(t, partial(id)[1])
	require.NoError(t, <-done)
	require.NoError(t, f.store.Verify(id))
}

// testCounters are pruning counters registered nowhere.
func testCounters() PruneCounters {
	return PruneCounters{Artifacts: prometheus.NewCounter(prometheus.CounterOpts{Name: "pruned_artifacts"}),
		Bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "pruned_bytes"})}
}
