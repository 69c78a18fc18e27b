// Package bus owns the messaging seam between the role loops and the swarm: the Bus
// interface and the typed inboxes it delivers gossip to.
package bus

import (
	"context"
	"sync"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/gossip"
)

// Bus is how role loops talk to the swarm: GossipSub and the artifact protocol in a swarm,
// direct delivery inside one process for a node that runs alone.
type Bus interface {
	Publish(ctx context.Context, msg any) error
	// Subscribe returns an inbox receiving every message published by anyone (this node
	// included). Close it when done.
	Subscribe() *Inbox
	// Fetch makes sure the artifact is in the local store, getting it from peers if needed
	// (hints: peers known to hold it).
	Fetch(ctx context.Context, id cid.Cid, hints ...peer.ID) error
	// FetchAtMost is Fetch for an artifact of at most max bytes (0: any size): a larger one
	// is not downloaded (artifact.ErrTooLarge), once its manifest says so.
	FetchAtMost(ctx context.Context, id cid.Cid, max uint64, hints ...peer.ID) error
	// Reach returns whether a message of msg's type published now goes from this node
	// straight to a peer (and to this node itself): in a swarm, whether the peer is
	// connected and its subscription to the type's topic has arrived. One whose
	// subscription has not arrived yet, a trainer that has just (re)started, say, gets
	// the message only if another peer forwards it, and gossip forwards nothing to a peer
	// that joins a topic's mesh after the message passed.
	Reach(msg any) func(peer string) bool
}

// Received is a message with the peer that published it.
type Received[T any] struct {
	From string
	Msg  *T
}

// Inbox has one buffered channel per message type. A slow reader loses the oldest
// messages of a full channel rather than blocking the bus (rounds recover through
// re-announcements and deadlines).
type Inbox struct {
	Announces     chan Received[gossip.Announce]
	Leases        chan Received[gossip.Leases]
	Contributions chan Received[gossip.Contribution]
	Heads         chan Received[gossip.Head]
	Attestations  chan Received[gossip.Attestation]
	Releases      chan Received[gossip.Release]
	close         func()
}

const inboxDepth = 1024

// NewInbox returns an empty inbox; close is what its Close does (unsubscribing it).
func NewInbox(close func()) *Inbox {
	return &Inbox{
		Announces:     make(chan Received[gossip.Announce], inboxDepth),
		Leases:        make(chan Received[gossip.Leases], inboxDepth),
		Contributions: make(chan Received[gossip.Contribution], inboxDepth),
		Heads:         make(chan Received[gossip.Head], inboxDepth),
		Attestations:  make(chan Received[gossip.Attestation], inboxDepth),
		Releases:      make(chan Received[gossip.Release], inboxDepth),
		close:         close,
	}
}

// Close unsubscribes.
func (in *Inbox) Close() { in.close() }

func offer[T any](ch chan Received[T], r Received[T]) {
	for {
		select {
		case ch <- r:
			return
		default:
		}
		select { // full: drop the oldest
		case <-ch:
		default:
		}
	}
}

// Deliver hands a decoded message to an inbox by its type; other types are ignored.
func (in *Inbox) Deliver(from string, msg any) {
	switch m := msg.(type) {
	case *gossip.Announce:
		offer(in.Announces, Received[gossip.Announce]{from, m})
	case *gossip.Leases:
		offer(in.Leases, Received[gossip.Leases]{from, m})
	case *gossip.Contribution:
		offer(in.Contributions, Received[gossip.Contribution]{from, m})
	case *gossip.Head:
		offer(in.Heads, Received[gossip.Head]{from, m})
	case *gossip.Attestation:
		offer(in.Attestations, Received[gossip.Attestation]{from, m})
	case *gossip.Release:
		offer(in.Releases, Received[gossip.Release]{from, m})
	}
}

// Fanout keeps the set of inboxes and delivers to all of them. Its zero value is ready;
// embedding it gives a Bus its Subscribe.
type Fanout struct {
	mu      sync.Mutex
	inboxes map[*Inbox]struct{}
}

// Subscribe returns a new inbox that receives everything delivered from now on.
func (f *Fanout) Subscribe() *Inbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inboxes == nil {
		f.inboxes = map[*Inbox]struct{}{}
	}
	var in *Inbox
	in = NewInbox(func() {
		f.mu.Lock()
		delete(f.inboxes, in)
		f.mu.Unlock()
	})
	f.inboxes[in] = struct{}{}
	return in
}

// Reach reaches every peer: what is delivered in the process reaches every inbox.
func (f *Fanout) Reach(any) func(string) bool { return func(string) bool { return true } }

// Deliver hands msg, published by from, to every inbox.
func (f *Fanout) Deliver(from string, msg any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for in := range f.inboxes {
		in.Deliver(from, msg)
	}
}
