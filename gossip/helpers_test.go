package gossip

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/lease"
)

const (
	testNet = "testnet"
	testExp = "exp1"
)

// newMocknet is mocknet.FullMeshConnected with Ed25519 identities: mocknet's own peers get
// ECDSA keys, whose peer ids do not carry the public key, and head signatures are checked
// against the key inside the signer's peer id (as on real nodes, which use Ed25519).
func newMocknet(t testing.TB, n int) (mocknet.Mocknet, []host.Host) {
	t.Helper()
	mn := mocknet.New()
	t.Cleanup(func() { _ = mn.Close() })
	hosts := make([]host.Host, n)
	for i := range hosts {
		key, _, err := crypto.GenerateEd25519Key(rand.Reader)
		require.NoError(t, err)
		addr := ma.StringCast(fmt.Sprintf("/ip4/10.1.%d.%d/tcp/4001", i/250, i%250+1))
		hosts[i], err = mn.AddPeer(key, addr)
		require.NoError(t, err)
	}
	return mn, hosts
}

// fullMesh links n hosts pairwise; connectAll then dials every pair (together they are
// mocknet.FullMeshConnected). Connect only after every pubsub is up, as a node does: a peer
// that connects before our pubsub handles the protocol can end half-attached in pubsub
// (we receive from it, but keep no send queue to it).
func fullMesh(t testing.TB, n int) (mocknet.Mocknet, []host.Host) {
	t.Helper()
	mn, hosts := newMocknet(t, n)
	require.NoError(t, mn.LinkAll())
	return mn, hosts
}

func connectAll(t testing.TB, mn mocknet.Mocknet) {
	t.Helper()
	require.NoError(t, mn.ConnectAllButSelf())
}

// testLogger keeps test output to errors: on mocknet, pubsub warns on every delivery that
// the null connection manager cannot hold decaying tags. GOSSIP_TEST_LOG=debug shows all.
var testLogger = func() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("GOSSIP_TEST_LOG") == "debug" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}()

// node is one Gossip under test with its own metrics registry.
type node struct {
	*Gossip
	host host.Host
	reg  *prometheus.Registry
}

func startNodes(t testing.TB, hosts []host.Host, validators []peer.ID, tune func(*Params)) []*node {
	t.Helper()
	nodes := make([]*node, len(hosts))
	for i, h := range hosts {
		reg := prometheus.NewRegistry()
		p := Params{Host: h, Network: testNet, Experiment: testExp, Validators: validators, Registerer: reg, Logger: testLogger}
		if tune != nil {
			tune(&p)
		}
		g, err := New(context.Background(), p)
		require.NoError(t, err)
		t.Cleanup(func() { _ = g.Close() })
		nodes[i] = &node{Gossip: g, host: h, reg: reg}
	}
	return nodes
}

// waitTopicPeers waits until every node knows at least want peers on every topic (the
// subscriptions have been exchanged, so a flood publish reaches them).
func waitTopicPeers(t testing.TB, nodes []*node, want func(i int) int) {
	t.Helper()
	require.Eventually(t, func() bool {
		for i, n := range nodes {
			for _, tp := range n.topics {
				if len(tp.ListPeers()) < want(i) {
					return false
				}
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "topic subscriptions did not propagate")
}

// recv waits for the next message on n, failing after d.
func recv(t testing.TB, n *node, d time.Duration) Message {
	t.Helper()
	select {
	case m, ok := <-n.Messages():
		require.True(t, ok, "messages closed")
		return m
	case <-time.After(d):
		t.Fatalf("node %s: no message within %s", n.self, d)
	}
	return Message{}
}

// quiet asserts n delivers nothing for d.
func quiet(t testing.TB, n *node, d time.Duration) {
	t.Helper()
	select {
	case m := <-n.Messages():
		t.Fatalf("node %s: unexpected %T from %s on %s", n.self, m.Msg, m.From, m.Topic)
	case <-time.After(d):
	}
}

// counter reads a counter from the node's registry, as a scrape of /metrics would.
func counter(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func privKey(t testing.TB, h host.Host) crypto.PrivKey {
	t.Helper()
	k := h.Peerstore().PrivKey(h.ID())
	require.NotNil(t, k)
	return k
}

// Fixtures. Each returns a message that passes every check when published by the peer it
// names.

var (
	fixBase  = cids.Record([]byte("base")).Bytes()
	fixDelta = cids.Record([]byte("delta")).Bytes()
	fixLease = cids.Record([]byte("lease")).Bytes()
)

func fixAnnounce(p peer.ID, at time.Time) *Announce {
	return &Announce{Experiment: testExp, Peer: p.String(), Roles: []string{"trainer"}, Capacity: 10,
		Version: "test", Time: at.UnixMilli()}
}

func fixContribution(p peer.ID, round uint64) *Contribution {
	return &Contribution{Experiment: testExp, Round: round, Base: fixBase, Lease: fixLease, Peer: p.String(),
		Delta: fixDelta, Samples: 10, Loss: 0.5, Microshards: []uint32{1, 2}, Seconds: 1}
}

func fixLeases(issuer, trainer peer.ID, deadline time.Time) *Leases {
	return &Leases{Experiment: testExp, Round: 1, Base: fixBase, Issuer: issuer.String(), Deadline: deadline.UnixMilli(),
		Leases: []lease.Lease{{Round: 1, Base: fixBase, Trainer: trainer.String(), Microshards: []uint32{1, 2},
			Expiry: deadline.UnixMilli(), Issuer: issuer.String()}}}
}

// fixChainHead is a valid head for round; contribs adds merged contributions (about 130
// bytes each) to reach a realistic size.
func fixChainHead(round uint64, contribs int) *chain.Head {
	h := &chain.Head{Version: 1, Network: testNet, Experiment: testExp, Round: round,
		Parent:     cids.Record(fmt.Appendf(nil, "parent %d", round)).Bytes(),
		Params:     cids.Record(fmt.Appendf(nil, "params %d", round)).Bytes(),
		LayoutHash: strings.Repeat("ab", 32),
		Policy:     chain.Policy{Kind: "diloco", OuterLR: 0.7, Momentum: 0.9, Nesterov: true, Aggregator: "mean", Codec: "fp32"},
		Metrics:    chain.Metrics{TrainLoss: 1.5, Samples: 100},
		Ledger:     chain.Ledger{Plan: "plan", Shards: 64, Epoch: 1, Consumed: make([]byte, 8)}}
	for i := range contribs {
		h.Contributions = append(h.Contributions, chain.Contribution{
			Peer:     fmt.Sprintf("12D3KooWPeer%040d", i),
			Artifact: cids.Record(fmt.Appendf(nil, "delta %d %d", round, i)).Bytes(),
			Lease:    cids.Record(fmt.Appendf(nil, "lease %d %d", round, i)).Bytes(),
			Samples:  100, Weight: 100, Microshards: []uint32{uint32(2 * i), uint32(2*i + 1)}, Loss: 1.5})
	}
	return h
}

// signedHead wraps h with the signatures of the given keys.
func signedHead(t testing.TB, h *chain.Head, signers ...crypto.PrivKey) (*Head, cid.Cid) {
	t.Helper()
	enc, err := h.Encode()
	require.NoError(t, err)
	sh := chain.SignedHead{Head: enc}
	id := sh.ID()
	for _, k := range signers {
		s, err := chain.Sign(k, id)
		require.NoError(t, err)
		sh.Add(s)
	}
	m := &Head{Experiment: testExp, Signed: sh}
	if len(signers) > 0 {
		m.Notes = &chain.Notes{Round: h.Round, HeldOut: map[string]float64{"accuracy": 0.9}, Seconds: 2, TrainSeconds: 1}
		require.NoError(t, chain.SignNotes(signers[0], id, m.Notes))
	}
	return m, id
}

func fixAttestation(t testing.TB, key crypto.PrivKey, head cid.Cid) *Attestation {
	t.Helper()
	s, err := chain.Sign(key, head)
	require.NoError(t, err)
	return &Attestation{Experiment: testExp, Head: head.Bytes(), Round: 1, Sig: s}
}

func encode(t testing.TB, v any) []byte {
	t.Helper()
	b, err := Encode(v)
	require.NoError(t, err)
	return b
}

// rawPeer is an attacker: a plain GossipSub on its own host, with no validators, joined
// to our topics, so it can put any bytes on the wire under any key it holds.
type rawPeer struct {
	ps     *pubsub.PubSub
	topics map[Kind]*pubsub.Topic
}

func newRawPeer(t testing.TB, h host.Host, opts ...pubsub.Option) *rawPeer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ps, err := pubsub.NewGossipSub(ctx, h, opts...)
	require.NoError(t, err)
	r := &rawPeer{ps: ps, topics: map[Kind]*pubsub.Topic{}}
	for _, k := range kinds {
		tp, err := ps.Join(TopicName(testNet, testExp, string(k)))
		require.NoError(t, err)
		_, err = tp.Relay() // take part in the mesh without a subscription
		require.NoError(t, err)
		r.topics[k] = tp
	}
	return r
}

func (r *rawPeer) waitPeers(t testing.TB, want int) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, tp := range r.topics {
			if len(tp.ListPeers()) < want {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond)
}
