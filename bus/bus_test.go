package bus

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/gossip"
)

func TestFanoutDeliversByTypeToEveryInbox(t *testing.T) {
	var f Fanout
	a, b := f.Subscribe(), f.Subscribe()
	f.Deliver("peer", &gossip.Leases{Round: 3})
	f.Deliver("peer", &gossip.Head{})
	f.Deliver("peer", "not a message") // ignored
	for _, in := range []*Inbox{a, b} {
		require.Len(t, in.Leases, 1)
		require.Len(t, in.Heads, 1)
		l := <-in.Leases
		require.Equal(t, "peer", l.From)
		require.Equal(t, uint64(3), l.Msg.Round)
	}
	a.Close()
	f.Deliver("peer", &gossip.Release{})
	require.Empty(t, a.Releases, "a closed inbox receives nothing")
	require.Len(t, b.Releases, 1)
}

func TestFullInboxDropsTheOldest(t *testing.T) {
	in := NewInbox(func() {})
	for r := range inboxDepth + 5 {
		in.Deliver("p", &gossip.Announce{Round: uint64(r)})
	}
	require.Len(t, in.Announces, inboxDepth)
	first := <-in.Announces
	require.Equal(t, uint64(5), first.Msg.Round, "the five oldest were dropped")
}
