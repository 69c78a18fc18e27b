package upkeep

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/ipfs/go-cid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/checkpoint"
	"github.com/p2pnode/p2pnode/internal/atomicfile"
)

// inFlightRounds is how many rounds an artifact that no kept head or checkpoint names
// survives after it was first seen: one, so the open round's work outlives the round (see
// Pruner). Longer would keep rounds nobody reads (a rejected delta, a contribution the
// next head did not merge); a validator then holds every trainer's contributions of
// several rounds.
const inFlightRounds = 1

// ContribRounds bounds how many rounds before the tip keep their contributions on the
// sparse codec (see Pruner): the walk that finds them reads one head per round at every
// sweep.
const ContribRounds = 32

// AnchorEvery: on the sparse codec the newest head whose round is a multiple of it (the
// anchor; genesis until round AnchorEvery) keeps its parameters and outer state, so that
// a node whose download of a head outlasts rounds — a late joiner on a slow link —
// downloads one that stays put for up to AnchorEvery rounds (a download the next anchor
// overtook is tried again on that one, which stays for all of them) and rebuilds the heads
// after it from their contributions: at most 2 × AnchorEvery − 1 rounds of them, which
// the one-pack budget covers while T trainers × a contribution's share of the pack stay
// under 1/15 (six trainers at 1 %).
const AnchorEvery = 8

// IsAnchor reports whether a head of round r is an anchor (see AnchorEvery).
func IsAnchor(r uint64) bool { return r%AnchorEvery == 0 }

// RetentionFile, in the store directory, records the round at which the pruner first saw
// each artifact (JSON: CID -> round). Losing it only delays pruning: what it does not
// name counts as new.
const RetentionFile = "retention.json"

// Pruner keeps the artifact store from growing with every round. After each checkpoint
// generation is durable (checkpoint.AfterPrune), at canonical round r it marks as live:
//
//   - the parameters of the newest K heads of the canonical chain (the tip, its parent,
//     ...), K = node.keep_heads: export and peers one head behind use them;
//   - the reference update the tip was screened with: the next round's screening
//     compares its own with it;
//   - the tip's outer state: the next merge starts from it. The outer state of an older
//     head is kept only while the newest checkpoint generation is not yet at the tip (a
//     snapshot of it may be waiting for the writer);
//   - on the sparse codec, the contributions merged into the tip: trainers rebuild the tip
//     from them (node.rebuildsHeads). And those merged into the heads before it, newest
//     first, while the ones held add up to no more than the tip's parameter pack and for at
//     most ContribRounds rounds: a node whose download of a head outlasted rounds (a late
//     joiner on a slow link) rebuilds the heads that came meanwhile from them instead of
//     downloading each anew, whose outer state is gone by then. A sparse contribution is
//     about 1 % of the pack, so a few trainers' rounds fit many times over; a large swarm's
//     fewer. And the parameters and outer state of the anchor (AnchorEvery), which such a
//     node downloads instead of the tip's. On the other codecs only a validator still
//     verifying the tip's proposal reads them (replays are recognised by CID, from the chain), so
//     they are kept until every configured validator has signed the tip, as far as this
//     node has seen, and no longer: they are the largest part of a validator's store, T ×
//     the model with fp32;
//   - everything the newest kept checkpoint generation references (so a restart finds
//     its head's parameters and outer state), and the parameters older generations name;
//   - the dataset's files;
//   - every artifact first seen at round r: in-flight work the chain does not name yet.
//     Work of the open round (a delta being encoded or fetched, a contribution, a merge
//     not yet proposed) is committed while the tip is the round's base, so it is first
//     seen at the tip's round or later and lives until the next head is canonical, which
//     names what of it was used;
//
// and deletes the rest, and the partial files of downloads every caller abandoned that
// are not of a live artifact and were first seen a round ago or more. So between rounds
// a validator holds K parameter packs and one outer state (and on the sparse codec one
// round of contributions, older rounds' up to one pack, and the anchor's parameters and
// outer state); a trainer K parameter packs (and its merged delta; on the sparse codec the
// outer state, contributions and anchor as a validator). An older checkpoint generation names
// its head's outer state, which is gone: a restart that has to fall back to it (the
// newest damaged) finds it unusable and resumes from the head chain instead (node/resume.go),
// losing only what the checkpoint alone held. Heads themselves (the chain store) are
// never touched. A deletion removes the manifest first, then the blob, so a crash leaves
// at worst a blob without a manifest: not an artifact (Has is false, peers are told "not
// found"), and the first sweep after a restart removes such blobs. An artifact
// (re)committed while a sweep runs is never deleted by it (artifact.Store.RemoveIdle).
type Pruner struct {
	store *artifact.Store
	heads *chain.Store
	tips  *chain.Tips
	keep  uint64
	// tipContribs keeps the contributions merged into the tip (the sparse codec's
	// trainers rebuild heads from them); without it they are kept only until every
	// validator has signed the tip.
	tipContribs bool
	path        string
	log         *slog.Logger
	m           PruneCounters

	mu    sync.Mutex
	data  map[cid.Cid]bool   // the dataset's files; nil until the dataset is loaded
	seen  map[cid.Cid]uint64 // round an artifact was first seen at; nil until loaded
	last  uint64             // round of the last sweep
	swept bool               // a sweep has run since start (orphan blobs are removed once)
	// partials removes idle partial downloads (artifact.Exchange.RemoveIdlePartials);
	// nil until the exchange exists. partialSeen is the round each was first seen at,
	// kept in memory only: after a restart they count as new.
	partials    func(drop func(cid.Cid) bool) (int64, error)
	partialSeen map[cid.Cid]uint64
}

// PruneCounters count what pruning deletes: artifacts and their bytes.
type PruneCounters struct {
	Artifacts, Bytes prometheus.Counter
}

// SetPartials lets the pruner delete interrupted downloads nobody resumed for a round.
func (p *Pruner) SetPartials(f func(drop func(cid.Cid) bool) (int64, error)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partials = f
}

// NewPruner is the pruner of store, keeping the newest keep heads of the chain tips
// follows; tipContribs keeps the tip's contributions (see Pruner). Its retention record is
// RetentionFile in storeDir.
func NewPruner(store *artifact.Store, heads *chain.Store, t *chain.Tips, keep int, tipContribs bool, storeDir string, m PruneCounters, log *slog.Logger) *Pruner {
	store.TrackCommits()
	return &Pruner{store: store, heads: heads, tips: t, keep: uint64(keep), tipContribs: tipContribs, path: filepath.Join(storeDir, RetentionFile), m: m, log: log}
}

// SetDataset names the dataset's files, which are never pruned. Until it is called the
// pruner deletes nothing: it could not tell a dataset file from an old delta.
func (p *Pruner) SetDataset(ids []cid.Cid) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.data = make(map[cid.Cid]bool, len(ids))
	for _, id := range ids {
		p.data[id] = true
	}
}

// AfterCheckpoint is the checkpoint.AfterPrune hook: it sweeps at the newest round known.
func (p *Pruner) AfterCheckpoint(kept []*checkpoint.State) {
	round := uint64(0)
	for _, st := range kept {
		round = max(round, st.Round)
	}
	if _, h := p.tips.Current(); h != nil {
		round = max(round, h.Round)
	}
	if _, err := p.sweep(round, kept); err != nil {
		p.log.Warn("pruning the artifact store failed; it is tried again after the next checkpoint", "err", err)
	}
}

// sweepResult says what a sweep did.
type sweepResult struct {
	Round   uint64
	Removed int
	Freed   int64
	Kept    int
}

// sweep deletes the artifacts not live at round (see Pruner).
func (p *Pruner) sweep(round uint64, kept []*checkpoint.State) (sweepResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	res := sweepResult{Round: round}
	if p.data == nil {
		return res, nil
	}
	// Rounds only go forward here: a sweep asked for an older round (a late checkpoint)
	// ages nothing.
	round = max(round, p.last)
	p.last, res.Round = round, round
	if p.seen == nil {
		p.seen = p.loadSeen()
	}
	if !p.swept {
		p.swept = true
		if n, err := p.store.RemoveOrphans(); err != nil {
			p.log.Warn("cannot remove blobs without a manifest", "err", err)
		} else if n > 0 {
			p.log.Info("removed blobs a crash left without a manifest", "bytes", n)
			p.m.Bytes.Add(float64(n))
		}
	}
	// Take the commits before listing: an artifact committed after this point is either
	// not listed or, if listed, protected by RemoveIdle.
	for _, id := range p.store.TakeCommitted() {
		p.seen[id] = round
	}
	ids, err := p.store.List()
	if err != nil {
		return res, err
	}
	live, done, err := p.live(kept)
	if err != nil {
		return res, err
	}
	present := make(map[cid.Cid]bool, len(ids))
	for _, id := range ids {
		present[id] = true
		if p.data[id] {
			continue
		}
		// done work is not in flight whenever it was first seen: it arrived after the
		// previous sweep, so it would otherwise live a round more.
		aged := old(p.seen, id, round, inFlightRounds) || done[id] // old records when first seen
		if live[id] || !aged {
			res.Kept++
			continue
		}
		size := int64(-1)
		if fi, err := os.Stat(p.store.BlobPath(id)); err == nil {
			size = fi.Size()
		}
		gone, err := p.store.RemoveIdle(id)
		if err != nil {
			return res, err
		}
		if !gone {
			res.Kept++
			continue
		}
		delete(p.seen, id)
		delete(present, id)
		res.Removed++
		res.Freed += max(size, 0)
	}
	for id := range p.seen {
		if !present[id] {
			delete(p.seen, id)
		}
	}
	p.prunePartials(round, live, &res)
	p.m.Artifacts.Add(float64(res.Removed))
	p.m.Bytes.Add(float64(res.Freed))
	if err := p.saveSeen(); err != nil {
		return res, err
	}
	if res.Removed > 0 {
		p.log.Debug("pruned the artifact store", "round", round, "removed", res.Removed, "bytes", res.Freed, "kept", res.Kept)
	}
	return res, nil
}

// old reports whether id, first seen at the round seen records (now, if it records none
// or a later one), is window or more rounds old at round.
func old(seen map[cid.Cid]uint64, id cid.Cid, round, window uint64) bool {
	first, ok := seen[id]
	if !ok || first > round {
		seen[id], first = round, round
	}
	return round-first >= window
}

// prunePartials deletes the partial state of downloads that were abandoned (no Fetch runs
// them), are not of an artifact the node keeps (a kept head's parameters: a large
// download a later fetch resumes) and were first seen a round or more ago. Caller holds
// p.mu.
func (p *Pruner) prunePartials(round uint64, live map[cid.Cid]bool, res *sweepResult) {
	if p.partials == nil {
		return
	}
	if p.partialSeen == nil {
		p.partialSeen = map[cid.Cid]uint64{}
	}
	listed := map[cid.Cid]bool{}
	freed, err := p.partials(func(id cid.Cid) bool {
		listed[id] = true
		if !old(p.partialSeen, id, round, inFlightRounds) || live[id] {
			return false
		}
		delete(p.partialSeen, id)
		return true
	})
	if err != nil {
		p.log.Warn("cannot prune interrupted downloads", "err", err)
	}
	for id := range p.partialSeen {
		if !listed[id] {
			delete(p.partialSeen, id)
		}
	}
	res.Freed += freed
}

// errEnoughHeads stops live's walk down the chain: K heads, and on the sparse codec the
// rounds whose contributions are kept, are behind it.
var errEnoughHeads = errors.New("enough heads")

// live is what the chain and the checkpoint need at the tip (see Pruner): the newest K
// heads' parameters, the tip's contributions if tipContribs (and older rounds' within one
// parameter pack, and the anchor's parameters and outer state), the outer state of the
// heads from the tip down to the newest kept generation's, and what the kept generations
// reference, less the outer state of the older ones. done is the tip's contributions when
// they are not kept (no trainer rebuilds heads, every validator signed the tip): finished
// work, not the open round's.
func (p *Pruner) live(kept []*checkpoint.State) (live, done map[cid.Cid]bool, err error) {
	live, done = map[cid.Cid]bool{}, map[cid.Cid]bool{}
	var newest *checkpoint.State
	for _, st := range kept {
		if newest == nil || st.Seq > newest.Seq {
			newest = st
		}
	}
	for _, st := range kept {
		for name, id := range st.Refs {
			if st == newest || name != refHeadOuter {
				live[id] = true
			}
		}
	}
	tip, _ := p.tips.Current()
	n := uint64(0)
	var budget int64  // bytes of older rounds' contributions that may still be kept
	anchored := false // the anchor's artifacts are marked (see AnchorEvery)
	err = p.heads.Walk(tip, func(id cid.Cid, h *chain.Head) error {
		if n < p.keep {
			if a, err := h.ParamsID(); err == nil && a.Defined() {
				live[a] = true
			}
			// Heads newer than the newest generation may be named by a snapshot the
			// checkpoint writer has yet to write: their outer state stays until it has.
			if n == 0 || (newest != nil && h.Round >= newest.Round) {
				if a, err := h.OuterStateID(); err == nil && a.Defined() {
					live[a] = true
				}
			}
		}
		if p.tipContribs && !anchored && IsAnchor(h.Round) {
			anchored = true
			for _, get := range []func() (cid.Cid, error){h.ParamsID, h.OuterStateID} {
				if a, err := get(); err == nil && a.Defined() {
					live[a] = true
				}
			}
		}
		switch {
		case n == 0:
			// The next round's screening compares its reference with the tip's.
			if a, err := h.ReferenceID(); err == nil && a.Defined() {
				live[a] = true
			}
			// Without rebuilding trainers only a validator still verifying the tip's
			// proposal reads its contributions: they stay until every validator has
			// signed the tip (as seen here), then go at once.
			keep := p.tipContribs || !p.signedByAll(id)
			for _, c := range h.Contributions {
				if a, err := cid.Cast(c.Artifact); err == nil {
					if keep {
						live[a] = true
					} else {
						done[a] = true
					}
				}
			}
			if a, err := h.ParamsID(); err == nil && p.tipContribs {
				budget = p.size(a)
			}
		case p.tipContribs && budget > 0:
			budget = p.keepContributions(h, budget, live)
		}
		n++
		more := n < p.keep || p.tipContribs && (!anchored || budget > 0 && n <= ContribRounds)
		if !more {
			return errEnoughHeads // the walk would read the next head before stopping
		}
		return nil
	})
	if err != nil && !errors.Is(err, errEnoughHeads) && n < p.keep {
		// Without a head we cannot know what it names: delete nothing this time. (A
		// missing head further back only ends the search for older contributions.)
		return nil, nil, fmt.Errorf("the newest %d heads from %s: %w", p.keep, tip, err)
	}
	return live, done, nil
}

// keepContributions marks the contributions h merged as live if the ones held here fit in
// budget bytes, and returns what is left of it: -1 once a round does not fit (rounds are
// kept whole, and newest first: a rebuild needs every round after the head it starts from).
func (p *Pruner) keepContributions(h *chain.Head, budget int64, live map[cid.Cid]bool) int64 {
	var ids []cid.Cid
	var bytes int64
	for _, c := range h.Contributions {
		a, err := cid.Cast(c.Artifact)
		if err != nil {
			continue
		}
		if n := p.size(a); n > 0 { // held here
			ids = append(ids, a)
			bytes += n
		}
	}
	if bytes > budget {
		return -1
	}
	for _, a := range ids {
		live[a] = true
	}
	return budget - bytes
}

// size is the bytes of artifact id, as its manifest gives them; 0 if it is not held.
func (p *Pruner) size(id cid.Cid) int64 {
	if !id.Defined() {
		return 0
	}
	m, err := p.store.Manifest(id)
	if err != nil {
		return 0
	}
	return int64(m.Size)
}

// signedByAll reports whether this node holds head id with a valid signature of every
// configured validator: no validator verifies it any more.
func (p *Pruner) signedByAll(id cid.Cid) bool {
	sh, _, err := p.heads.Get(id)
	if err != nil {
		return false
	}
	vs := p.tips.Validators()
	_, err = sh.Quorum(vs, len(vs))
	return err == nil
}

func (p *Pruner) loadSeen() map[cid.Cid]uint64 {
	seen := map[cid.Cid]uint64{}
	b, err := os.ReadFile(p.path)
	if errors.Is(err, fs.ErrNotExist) {
		return seen
	}
	var raw map[string]uint64
	if err == nil {
		err = json.Unmarshal(b, &raw)
	}
	if err != nil {
		p.log.Warn("retention record unreadable: every stored artifact counts as new", "file", p.path, "err", err)
		return seen
	}
	for k, r := range raw {
		if id, err := cid.Decode(k); err == nil {
			seen[id] = r
		}
	}
	return seen
}

func (p *Pruner) saveSeen() error {
	raw := make(map[string]uint64, len(p.seen))
	for id, r := range p.seen {
		raw[id.String()] = r
	}
	b, err := json.Marshal(raw) // keys sorted
	if err != nil {
		return err
	}
	if err := atomicfile.Write(p.path, b, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", p.path, err)
	}
	return nil
}
