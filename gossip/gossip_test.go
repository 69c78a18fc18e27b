package gossip

import (
	"context"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"
)

func TestTopicName(t *testing.T) {
	require.Equal(t, "/p2ptrain/main/digits-1/heads", TopicName("main", "digits-1", "heads"))
}

func TestNewChecksParams(t *testing.T) {
	_, hosts := newMocknet(t, 1)
	for _, p := range []Params{
		{Network: testNet, Experiment: testExp},
		{Host: hosts[0], Network: "", Experiment: testExp},
		{Host: hosts[0], Network: testNet, Experiment: "a/b"},
		{Host: hosts[0], Network: testNet, Experiment: testExp, QueueSize: -1},
	} {
		_, err := New(context.Background(), p)
		require.ErrorIs(t, err, ErrBadParams)
	}
}

// Every message type reaches every node, the publisher included, decoded and attributed
// to its author.
func TestEveryMessageReachesAllPeers(t *testing.T) {
	mn, hosts := fullMesh(t, 4)
	val, trainer := hosts[0], hosts[1]
	nodes := startNodes(t, hosts, []peer.ID{val.ID()}, nil)
	connectAll(t, mn)
	waitTopicPeers(t, nodes, func(int) int { return len(nodes) - 1 })

	head, headID := signedHead(t, fixChainHead(3, 2), privKey(t, val))
	cases := []struct {
		name  string
		from  int
		msg   any
		topic Kind
	}{
		{"announce", 1, fixAnnounce(trainer.ID(), time.Now()), KindPeers},
		{"leases", 0, fixLeases(val.ID(), trainer.ID(), time.Now().Add(time.Minute)), KindLeases},
		{"contribution", 1, fixContribution(trainer.ID(), 1), KindContributions},
		{"head", 0, head, KindHeads},
		{"attestation", 0, fixAttestation(t, privKey(t, val), headID), KindAttestations},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, nodes[tc.from].Publish(context.Background(), tc.msg))
			for _, n := range nodes {
				m := recv(t, n, 5*time.Second)
				require.Equal(t, hosts[tc.from].ID(), m.From)
				require.Equal(t, TopicName(testNet, testExp, string(tc.topic)), m.Topic)
				require.Equal(t, tc.msg, m.Msg)
				require.NotSame(t, tc.msg, m.Msg, "subscribers get the decoded bytes, not the publisher's value")
			}
		})
	}
	for _, n := range nodes {
		require.Equal(t, 1.0, counter(t, n.reg, "p2ptrain_gossip_messages_total",
			map[string]string{"topic": "heads", "result": "accept", "reason": "ok"}))
	}
	require.Equal(t, 1.0, counter(t, nodes[0].reg, "p2ptrain_gossip_published_total", map[string]string{"topic": "heads"}))
}

// The same bytes published twice, by one node or by two validators, are delivered once.
func TestDuplicatesDeliveredOnce(t *testing.T) {
	mn, hosts := fullMesh(t, 4)
	v1, v2 := hosts[0], hosts[1]
	nodes := startNodes(t, hosts, []peer.ID{v1.ID(), v2.ID()}, nil)
	connectAll(t, mn)
	waitTopicPeers(t, nodes, func(int) int { return len(nodes) - 1 })
	ctx := context.Background()

	ann := fixAnnounce(hosts[2].ID(), time.Now())
	require.NoError(t, nodes[2].Publish(ctx, ann))
	require.NoError(t, nodes[2].Publish(ctx, ann))

	head, _ := signedHead(t, fixChainHead(5, 1), privKey(t, v1), privKey(t, v2))
	require.NoError(t, nodes[0].Publish(ctx, head))
	require.NoError(t, nodes[1].Publish(ctx, head))

	for _, n := range nodes {
		got := map[Kind]int{}
		for range 2 {
			m := recv(t, n, 5*time.Second)
			k, err := kindOf(m.Msg)
			require.NoError(t, err)
			got[k]++
		}
		require.Equal(t, map[Kind]int{KindPeers: 1, KindHeads: 1}, got)
		quiet(t, n, 300*time.Millisecond)
	}
}

// A node added to or removed from the validator set is trusted, or not, from then on.
func TestSetValidatorsTakesEffect(t *testing.T) {
	mn, hosts := fullMesh(t, 3)
	val := hosts[0]
	nodes := startNodes(t, hosts, nil, nil)
	connectAll(t, mn)
	waitTopicPeers(t, nodes, func(int) int { return len(nodes) - 1 })
	ctx := context.Background()

	h1, _ := signedHead(t, fixChainHead(1, 0), privKey(t, val))
	err := nodes[0].Publish(ctx, h1)
	require.ErrorIs(t, err, ErrRejected, "not yet a validator, even to itself")

	for _, n := range nodes {
		n.SetValidators([]peer.ID{val.ID()})
	}
	require.NoError(t, nodes[0].Publish(ctx, h1))
	for _, n := range nodes {
		require.Equal(t, h1, recv(t, n, 5*time.Second).Msg)
	}

	// The receivers drop it; the publisher still trusts itself.
	nodes[1].SetValidators(nil)
	nodes[2].SetValidators([]peer.ID{hosts[1].ID()})
	h2, _ := signedHead(t, fixChainHead(2, 0), privKey(t, val))
	require.NoError(t, nodes[0].Publish(ctx, h2))
	require.Equal(t, h2, recv(t, nodes[0], 5*time.Second).Msg)
	for _, n := range nodes[1:] {
		require.Eventually(t, func() bool {
			return counter(t, n.reg, "p2ptrain_gossip_messages_total",
				map[string]string{"topic": "heads", "result": "reject", "reason": reasonNotValidator}) == 1
		}, 5*time.Second, 10*time.Millisecond)
		quiet(t, n, 100*time.Millisecond)
	}
}

// Our own invalid messages fail at Publish with the reason, and are not sent.
func TestPublishChecksOwnMessages(t *testing.T) {
	mn, hosts := fullMesh(t, 2)
	nodes := startNodes(t, hosts, []peer.ID{hosts[0].ID()}, nil)
	connectAll(t, mn)
	waitTopicPeers(t, nodes, func(int) int { return 1 })
	ctx := context.Background()

	err := nodes[1].Publish(ctx, fixAnnounce(hosts[1].ID(), time.Now().Add(-time.Hour)))
	require.ErrorIs(t, err, ErrIgnored)
	err = nodes[1].Publish(ctx, fixContribution(hosts[0].ID(), 1))
	require.ErrorIs(t, err, ErrRejected)
	bad := fixContribution(hosts[1].ID(), 1)
	bad.Delta = []byte("not a cid")
	require.ErrorIs(t, nodes[1].Publish(ctx, bad), ErrMalformed)
	require.ErrorIs(t, nodes[1].Publish(ctx, "hello"), ErrUnknownMessage)
	quiet(t, nodes[0], 100*time.Millisecond)
	require.Equal(t, 1.0, counter(t, nodes[1].reg, "p2ptrain_gossip_publish_errors_total",
		map[string]string{"topic": "contributions", "reason": reasonAuthorMismatch}))
}

func TestCloseEndsMessages(t *testing.T) {
	_, hosts := fullMesh(t, 1)
	nodes := startNodes(t, hosts, nil, nil)
	require.NoError(t, nodes[0].Close())
	require.NoError(t, nodes[0].Close(), "idempotent")
	_, ok := <-nodes[0].Messages()
	require.False(t, ok)
	require.ErrorIs(t, nodes[0].Publish(context.Background(), fixAnnounce(hosts[0].ID(), time.Now())), ErrClosed)

	// A new instance on the same host works.
	again := startNodes(t, hosts, nil, nil)
	require.NoError(t, again[0].Publish(context.Background(), fixAnnounce(hosts[0].ID(), time.Now())))
	recv(t, again[0], 5*time.Second)
}

// Reached names the peers a message published now goes to: this node, and the connected
// peers whose subscription to the message's topic has arrived — not a peer subscribed to
// another topic only (a trainer whose subscription to the leases topic is not in yet).
func TestReachedListsTheTopicsSubscribers(t *testing.T) {
	mn, hosts := fullMesh(t, 3)
	nodes := startNodes(t, hosts[:2], []peer.ID{hosts[0].ID()}, nil)
	a, b := nodes[0], nodes[1]
	require.Equal(t, map[peer.ID]bool{a.self: true}, a.Reached(&Leases{}), "nobody connected yet")

	// The third peer subscribes to the announcements alone.
	ps, err := pubsub.NewGossipSub(t.Context(), hosts[2])
	require.NoError(t, err)
	tp, err := ps.Join(TopicName(testNet, testExp, string(KindPeers)))
	require.NoError(t, err)
	_, err = tp.Subscribe()
	require.NoError(t, err)
	connectAll(t, mn)
	require.Eventually(t, func() bool { return len(a.Reached(&Announce{})) == 3 }, 10*time.Second, 10*time.Millisecond,
		"announcement subscribers: %v", a.Reached(&Announce{}))
	require.Equal(t, map[peer.ID]bool{a.self: true, b.self: true}, a.Reached(&Leases{}))
	require.Nil(t, a.Reached("not a message"))
}
