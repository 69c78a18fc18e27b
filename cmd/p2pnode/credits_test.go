package main

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/node"
	"github.com/p2pnode/p2pnode/p2p"
)

// `credits` adds up the chain in a node's store: merges from the heads, rejections and
// quarantines from the notes a configured validator signed (notes signed by anyone else
// count for nothing), this node's row marked.
func TestCreditsCommand(t *testing.T) {
	dir := t.TempDir()
	var self string
	var validator, stranger crypto.PrivKey
	var vid string
	cfgPath := writeConfig(t, dir, func(c *config.Config) {
		validator, _, _ = crypto.GenerateEd25519Key(nil)
		vid, _ = p2p.PeerID(validator)
		c.Experiment.Validators = []string{vid}
		c.Experiment.Roles = []string{config.RoleTrainer}
	})
	cfg, err := config.Load(cfgPath)
	require.NoError(t, err)
	key, err := p2p.LoadIdentity(filepath.Join(cfg.Node.StoreDir, "identity.key"), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	self, err = p2p.PeerID(key)
	require.NoError(t, err)
	stranger, _, _ = crypto.GenerateEd25519Key(nil)

	store := filepath.Join(dir, "store")
	heads, err := chain.OpenStore(filepath.Join(store, "heads"))
	require.NoError(t, err)
	g := putHead(t, store, make([]float32, 128), 0, cid.Undef)
	contrib := func(peer string, samples uint64) chain.Contribution {
		return chain.Contribution{Peer: peer, Artifact: cids.Record([]byte(peer)).Bytes(), Samples: samples, Weight: 1}
	}
	h1 := putChild(t, store, g, 1, contrib("peerA", 64), contrib(self, 32))
	notes := func(id cid.Cid, k crypto.PrivKey, n *chain.Notes) {
		require.NoError(t, chain.SignNotes(k, id, n))
		require.NoError(t, heads.PutNotes(id, n))
	}
	notes(h1, validator, &chain.Notes{Round: 1, Rejected: 2, Rejections: []chain.Rejection{
		{Peer: self, Reason: "norm_outlier"}, {Peer: "peerC", Reason: "non_finite"}},
		Quarantined: []chain.Quarantine{{Peer: "peerC", Until: 6}}})
	h2 := putChild(t, store, h1, 2, contrib("peerA", 64))
	notes(h2, stranger, &chain.Notes{Round: 2, Rejected: 1, Rejections: []chain.Rejection{{Peer: "peerA", Reason: "late"}}})

	out, err := run(t, "credits", "--config", cfgPath)
	require.NoError(t, err, out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 6, out)
	require.Equal(t, "head "+h2.String()+" (round 2)", lines[0])
	require.Regexp(t, `^peerA +2 +128 +0 +1–2 +- +-$`, lines[2], "the stranger's notes do not count")
	require.Regexp(t, `^`+self+` \(this node\) +1 +32 +1 +1–1 +- +norm_outlier$`, lines[3])
	require.Regexp(t, `^peerC +0 +0 +1 +1–1 +until round 6 +non_finite$`, lines[4])

	out, err = run(t, "credits", "--config", cfgPath, "--json", "--head", h1.String())
	require.NoError(t, err, out)
	var got struct {
		Round    uint64
		Self     string
		Accounts []struct {
			Peer     string
			Merged   int
			Rejected map[string]int
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Equal(t, uint64(1), got.Round)
	require.Equal(t, self, got.Self)
	require.Len(t, got.Accounts, 3)

	_, err = run(t, "credits", "--config", cfgPath, "--head", "bafynothead")
	require.Error(t, err)
}

// putChild stores a head of round on parent with the given contributions (sorted by peer)
// and makes it the tip.
func putChild(t *testing.T, store string, parent cid.Cid, round uint64, cs ...chain.Contribution) cid.Cid {
	t.Helper()
	heads, err := chain.OpenStore(filepath.Join(store, "heads"))
	require.NoError(t, err)
	_, p, err := heads.Get(parent)
	require.NoError(t, err)
	h := *p
	h.Round, h.Parent = round, parent.Bytes()
	h.Contributions = cs
	slices.SortFunc(h.Contributions, func(a, b chain.Contribution) int { return strings.Compare(a.Peer, b.Peer) })
	b, err := h.Encode()
	require.NoError(t, err)
	_, err = heads.Put(&chain.SignedHead{Head: b})
	require.NoError(t, err)
	id, err := h.ID()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(store, node.TipFile), []byte(id.String()+"\n"), 0o644))
	return id
}
