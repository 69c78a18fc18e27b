package artifact

import (
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"
)

// A full book evicts copies before origins: a swarm's copies, announced every few
// seconds, must not push out the origin recorded once (a head's proposer).
func TestHolderBookEvictsCopiesFirst(t *testing.T) {
	b := newHolderBook(time.Hour)
	id := testID()
	now := time.Now()
	origin := peer.ID("origin")
	b.add(id, origin, now, false)
	for i := range 2 * maxHoldersPerID {
		b.add(id, peer.ID(fmt.Sprintf("copy-%d", i)), now.Add(time.Duration(i+1)*time.Second), true)
	}
	got := b.get(id, now.Add(time.Hour/2))
	require.Len(t, got, maxHoldersPerID)
	require.Contains(t, got, holder{p: origin})
	require.Contains(t, got, holder{p: peer.ID(fmt.Sprintf("copy-%d", 2*maxHoldersPerID-1)), copy: true}, "the newest copy")
	require.NotContains(t, got, holder{p: "copy-0", copy: true}, "the oldest copy")

	// An origin announcing a copy of its own artifact stays an origin.
	b.add(id, origin, now.Add(time.Minute), true)
	require.Contains(t, b.get(id, now.Add(time.Hour/2)), holder{p: origin})
}
