package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/validator"
)

// TestTakeoverFromALiveLeader: the next validator in the order of one round does not hear
// that round's leader (its grants and heartbeats are held back at that validator, as a
// starved process reads them seconds late) and takes the round over while the leader is
// alive and has leased every trainer. The trainers finish the first leader's leases only
// once the takeover is under way. Before the fix the first leader never read the
// takeover: both leased the round, each waited for the other's trainers, and every
// contribution made under the first leader's lease reached the new one as no_lease, a
// strike toward quarantine for an honest trainer.
//
// Now the first leader steps aside (it proposes nothing and attests the new leader's
// head), the chain has one head per round on every node with no head signed short of a
// quorum, and the new leader rejects the first leader's contributions as foreign_lease,
// without a strike: no trainer is quarantined and no contribution is rejected as no_lease.
func TestTakeoverFromALiveLeader(t *testing.T) {
	const rounds, stalled = 4, 2
	c, validators, vids := takeoverCluster(t, rounds)
	hook := &lateLeader{round: stalled, validators: vids, steppedAside: func() bool {
		for _, v := range validators {
			if hasEvent(v, "stepaside", "") {
				return true
			}
		}
		return false
	}}
	withLateLeader(t, c, hook)
	c.startAll()
	c.waitDone(3 * time.Minute)
	c.requireOneChain(c.nodes, rounds)
	require.Empty(t, c.requireNoConflictingQuorums(2), "every head signed reached a quorum: nobody proposed a competing head")

	var tookOver, stepped []string
	foreign := uint64(0)
	for _, v := range validators {
		if hasEvent(v, "takeover", "") {
			tookOver = append(tookOver, v.name)
		}
		if hasEvent(v, "stepaside", "") {
			stepped = append(stepped, v.name)
		}
		st := v.n.Status()
		for _, e := range st.Events {
			require.NotEqual(t, "quarantine", e.Kind, "%s: %s", v.name, e.Text)
		}
		if st.Validator == nil {
			continue // it never led a round: it rejected nothing and leased nobody
		}
		require.Zero(t, st.Validator.Rejections["no_lease"], "%s struck an honest trainer: %v", v.name, st.Validator.Rejections)
		require.Empty(t, st.Validator.Quarantined, v.name)
		foreign += st.Validator.Rejections[validator.ReasonForeignLease]
	}
	require.Len(t, tookOver, 1, "one validator took round %d over", stalled)
	require.Len(t, stepped, 1, "the first leader of round %d stepped aside", stalled)
	require.NotEqual(t, tookOver, stepped)
	require.Positive(t, foreign, "the first leader's leases were trained and reached the new leader")
}

// TestSteppedAsideLeaderLeadsAgain: as in TestTakeoverFromALiveLeader the next validator
// takes round 2 over from a live leader, which steps aside; then the new leader is cut off
// from the first leader and from the trainers (it still reaches the third validator, which
// therefore waits for it). To the first leader every validator after it in the order is
// silent: it leads the round again with fresh attempts, the round closes with its head at
// a quorum (the third validator's signature and its own), and no validator signs two
// heads of one round. The new leader, which collected nothing, proposed nothing.
func TestSteppedAsideLeaderLeadsAgain(t *testing.T) {
	const rounds, stalled = 4, 2
	c, validators, vids := takeoverCluster(t, rounds)
	hook := &lateLeader{round: stalled, validators: vids, partition: true, steppedAside: func() bool {
		for _, v := range validators {
			if hasEvent(v, "stepaside", "") {
				return true
			}
		}
		return false
	}}
	ledAgain := func(v *clusterNode) bool {
		for _, e := range v.n.Status().Events {
			if e.Kind == "takeover" && strings.Contains(e.Text, "leading the round again") {
				return true
			}
		}
		return false
	}
	// The trainers report on the leases of the round's first two leaders only once the
	// first leads it again: those contributions reach it as it leads.
	hook.release = func() bool { return slices.ContainsFunc(validators, ledAgain) }
	withLateLeader(t, c, hook)
	start := time.Now()
	c.startAll()
	c.waitDone(3 * time.Minute)
	c.requireOneChain(c.nodes, rounds)
	require.Empty(t, c.requireNoConflictingQuorums(2), "every head signed reached a quorum, and no validator signed two heads of a round")

	proposed := func(n *clusterNode, round uint64) bool {
		for _, l := range strings.Split(n.logs.String(), "\n") {
			if strings.Contains(l, `msg="proposed head"`) && strings.Contains(l, fmt.Sprintf(" round=%d ", round)) {
				return true
			}
		}
		return false
	}
	var first, taker *clusterNode
	for _, v := range validators {
		if hasEvent(v, "stepaside", "") {
			require.Nil(t, first, "one validator stepped aside")
			first = v
		}
	}
	require.NotNil(t, first, "the first leader of round %d stepped aside", stalled)
	require.True(t, ledAgain(first), "%s led round %d again once the validators after it fell silent", first.name, stalled)
	require.True(t, proposed(first, stalled), "%s proposed round %d's head", first.name, stalled)
	for _, v := range validators {
		if v != first && hasEvent(v, "takeover", "") {
			require.Nil(t, taker, "one validator took round %d over", stalled)
			taker = v
		}
	}
	require.NotNil(t, taker, "a validator took round %d over from the live leader", stalled)
	require.False(t, proposed(taker, stalled), "%s collected nothing in round %d and proposed nothing", taker.name, stalled)
	for _, v := range validators {
		if v == taker {
			continue // cut off, it let its trainers' leases expire: misses it counts, not the others'
		}
		if st := v.n.Status().Validator; st != nil {
			require.Zero(t, st.Rejections["no_lease"], "%s struck an honest trainer: %v", v.name, st.Rejections)
			require.Empty(t, st.Quarantined, v.name)
		}
	}
	// The contributions under its own leases from before it stepped aside reached it as it
	// led again: late, no strike.
	require.Positive(t, first.n.Status().Validator.Rejections["late"], "%s read contributions under its earlier leases", first.name)
	t.Logf("%d rounds in %s; %s stepped aside in round %d and led it again (rejections %v), %s took it over", rounds,
		time.Since(start).Round(100*time.Millisecond), first.name, stalled, first.n.Status().Validator.Rejections, taker.name)
}

// hasEvent says whether n's status shows an event of kind whose text contains text ("":
// any).
func hasEvent(n *clusterNode, kind, text string) bool {
	for _, e := range n.n.Status().Events {
		if e.Kind == kind && strings.Contains(e.Text, text) {
			return true
		}
	}
	return false
}

// lateLeader is the test's hook for a takeover from a live leader in one round. At the
// round's second validator in the order, the grants and heartbeats of its first are held
// back until that validator has taken the round over (it published its own grant of the
// round). The trainers hold their contributions of the round until a validator stepped
// aside, so the first leader's leases are reported only to the new leader, and the first
// leader cannot have closed the round before it heard the takeover.
//
// With partition, once the first leader stepped aside the new leader is cut off from it
// and from the trainers for the rest of the round (its grants and proposals of the round
// no longer reach them, and no contribution reaches it), while the third validator still
// hears it: to the first leader every validator after it is silent, and the third, which
// hears the new leader's heartbeats, does not take the round over.
type lateLeader struct {
	round        uint64
	validators   []string
	steppedAside func() bool
	partition    bool
	// release says when the trainers may publish their contributions of the round (nil:
	// once a validator stepped aside).
	release func() bool
}

// order is the validators' order of the round on base (nil: not a CID).
func (h *lateLeader) order(base []byte) []string {
	id, err := cid.Cast(base)
	if err != nil {
		return nil
	}
	return lease.Leaders(h.validators, id)
}

// cut says whether a message of round from the validator from is lost at self, a node that
// is not the new leader: from is the new leader of the hook's round (second in its order
// on base) and the first leader stepped aside.
func (h *lateLeader) cut(round uint64, base []byte, from string) bool {
	if !h.partition || round != h.round {
		return false
	}
	order := h.order(base)
	return len(order) > 1 && order[1] == from && h.steppedAside()
}

func (h *lateLeader) validatorOption(self string) fx.Option {
	return fx.Decorate(func(b bus.Bus) bus.Bus { return &lateLeaderBus{Bus: b, h: h, self: self} })
}

func (h *lateLeader) trainerOption() fx.Option {
	return fx.Decorate(func(b bus.Bus) bus.Bus { return &gatedTrainerBus{Bus: b, h: h} })
}

type gatedTrainerBus struct {
	bus.Bus
	h *lateLeader
}

func (b *gatedTrainerBus) Subscribe() *bus.Inbox {
	return relayInbox(b.Bus.Subscribe(), inboxFilter{
		leases: func(m bus.Received[gossip.Leases], out *bus.Inbox) {
			if !b.h.cut(m.Msg.Round, m.Msg.Base, m.From) {
				out.Deliver(m.From, m.Msg)
			}
		},
	})
}

func (b *gatedTrainerBus) Publish(ctx context.Context, msg any) error {
	if c, ok := msg.(*gossip.Contribution); ok && c.Round == b.h.round {
		// Polled, not signalled: the validators' status is the only view of them here. The
		// bound keeps a regression from hanging the test; it then fails on its assertions.
		release := b.h.steppedAside
		if b.h.release != nil {
			release = b.h.release
		}
		for end := time.Now().Add(time.Minute); !release() && time.Now().Before(end); {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return b.Bus.Publish(ctx, msg)
}

type lateLeaderBus struct {
	bus.Bus
	h    *lateLeader
	self string
}

func (b *lateLeaderBus) Subscribe() *bus.Inbox {
	var held []bus.Received[gossip.Leases]
	released := false
	return relayInbox(b.Bus.Subscribe(), inboxFilter{
		leases: func(m bus.Received[gossip.Leases], out *bus.Inbox) {
			if b.h.cut(m.Msg.Round, m.Msg.Base, m.From) && m.From != b.self && b.h.order(m.Msg.Base)[0] == b.self {
				return // the new leader is cut off from the first
			}
			if !released && m.Msg.Round == b.h.round {
				order := b.h.order(m.Msg.Base)
				if len(order) > 1 && order[1] == b.self {
					switch m.From {
					case order[0]:
						held = append(held, m)
						return
					case b.self:
						released = true
						for _, x := range held {
							out.Deliver(x.From, x.Msg)
						}
						held = nil
					}
				}
			}
			out.Deliver(m.From, m.Msg)
		},
		heads: func(m bus.Received[gossip.Head], out *bus.Inbox) {
			if h, err := m.Msg.Signed.Decode(); err == nil && m.From != b.self && b.h.cut(h.Round, h.Parent, m.From) &&
				b.h.order(h.Parent)[0] == b.self {
				return // the new leader's proposal does not reach the first leader either
			}
			out.Deliver(m.From, m.Msg)
		},
		contributions: func(m bus.Received[gossip.Contribution], out *bus.Inbox) {
			if b.h.partition && m.Msg.Round == b.h.round {
				if order := b.h.order(m.Msg.Base); len(order) > 1 && order[1] == b.self {
					return // the new leader collects nothing in the round
				}
			}
			out.Deliver(m.From, m.Msg)
		},
	})
}

// withLateLeader puts hook on every node of c (min_group 3), and logs every node's log if
// the test fails.
func withLateLeader(t *testing.T, c *cluster, hook *lateLeader) {
	t.Helper()
	for _, n := range c.nodes {
		n.cfg.Lease.MinGroup = 3
		n.logs = &syncBuffer{}
		if strings.HasPrefix(n.name, "validator") {
			n.extra = append(n.extra, hook.validatorOption(n.host.ID().String()))
		} else {
			n.extra = append(n.extra, hook.trainerOption())
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.nodes {
				t.Logf("%s:\n%s", n.name, nodeLines(n.logs.String()))
			}
		}
	})
}

// takeoverCluster is 3 validators and 3 trainers for rounds rounds, with the validators
// and their peer ids.
func takeoverCluster(t *testing.T, rounds int) (*cluster, []*clusterNode, []string) {
	t.Helper()
	c := newCluster(t, 3, 3, rounds, 40)
	validators := c.nodes[:3]
	var vids []string
	for _, v := range validators {
		vids = append(vids, v.host.ID().String())
	}
	return c, validators, vids
}
