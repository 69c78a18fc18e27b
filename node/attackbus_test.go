//go:build attack

package node

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/gossip"
)

// Attacks a test trainer makes on the wire, after it trained honestly: the bus of an
// attacker rewrites, holds back or drops what its trainer publishes. They live in test
// code (not in adversary, attack.go) because only the in-process matrix uses them.
const (
	busCopy   = "copy"   // announce another trainer's delta of this round as its own
	busStale  = "stale"  // name the head before the lease's base as the base
	busSilent = "silent" // take leases, never report
	busLate   = "late"   // report every contribution after its lease's deadline
)

// attackBusOption decorates a node's Bus with the attack kind.
func attackBusOption(kind string) fx.Option {
	return fx.Decorate(func(lc fx.Lifecycle, b bus.Bus) bus.Bus {
		a := &attackBus{Bus: b, kind: kind, in: b.Subscribe(), bases: map[uint64][]byte{}, deadlines: map[uint64]int64{},
			deltas: map[uint64][]seenDelta{}}
		runInBackground(lc, a.watch, func() error { a.in.Close(); return nil })
		return a
	})
}

type seenDelta struct {
	peer  string
	delta []byte
}

// attackBus is a Bus that misbehaves on the contributions its node publishes.
type attackBus struct {
	bus.Bus
	kind string
	in   *bus.Inbox

	mu        sync.Mutex
	changed   chan struct{}          // closed and replaced when deltas grows
	bases     map[uint64][]byte      // the base head of each round's leases
	deadlines map[uint64]int64       // the latest lease deadline of each round
	deltas    map[uint64][]seenDelta // contributions of other peers, by round
}

func (a *attackBus) watch(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case l := <-a.in.Leases:
			a.mu.Lock()
			a.bases[l.Msg.Round] = l.Msg.Base
			a.deadlines[l.Msg.Round] = max(a.deadlines[l.Msg.Round], l.Msg.Deadline)
			a.mu.Unlock()
		case c := <-a.in.Contributions:
			a.mu.Lock()
			a.deltas[c.Msg.Round] = append(a.deltas[c.Msg.Round], seenDelta{peer: c.From, delta: c.Msg.Delta})
			if a.changed != nil {
				close(a.changed)
				a.changed = nil
			}
			a.mu.Unlock()
		case <-a.in.Announces:
		case <-a.in.Heads:
		case <-a.in.Attestations:
		case <-a.in.Releases:
		}
	}
}

func (a *attackBus) Publish(ctx context.Context, msg any) error {
	c, ok := msg.(*gossip.Contribution)
	if !ok {
		return a.Bus.Publish(ctx, msg)
	}
	m := *c
	switch a.kind {
	case busSilent:
		return nil
	case busLate:
		a.mu.Lock()
		deadline := a.deadlines[m.Round]
		a.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(time.UnixMilli(deadline).Add(500 * time.Millisecond))):
		}
	case busStale:
		a.mu.Lock()
		old, ok := a.bases[m.Round-1]
		a.mu.Unlock()
		if !ok {
			return nil // nothing older than the lease's base yet
		}
		m.Base = old
	case busCopy:
		// The first delta another peer announces for this round (waiting for one a while).
		timeout := time.After(5 * time.Second)
		for {
			a.mu.Lock()
			i := slices.IndexFunc(a.deltas[m.Round], func(d seenDelta) bool { return d.peer != m.Peer })
			if i >= 0 {
				m.Delta = a.deltas[m.Round][i].delta
				a.mu.Unlock()
				break
			}
			if a.changed == nil {
				a.changed = make(chan struct{})
			}
			ch := a.changed
			a.mu.Unlock()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-timeout:
				return nil // nobody to copy from
			case <-ch:
			}
		}
	}
	return a.Bus.Publish(ctx, &m)
}
