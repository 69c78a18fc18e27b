package node

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/validator"
)

// signLog is the test's hook on the validators' buses: it records every head signature a
// validator publishes (proposals, re-published heads, attestations), across restarts, and
// once mutes the first validator that proposes a head of round stalled: that proposal and
// everything else its process publishes after it are dropped, until the test kills it.
type signLog struct {
	stalled uint64

	mu     sync.Mutex
	signed map[string]map[uint64]map[string]bool // signer → round → heads
	victim string
	muted  chan struct{} // closed when the victim is chosen
}

func newSignLog(stalled uint64) *signLog {
	return &signLog{stalled: stalled, signed: map[string]map[uint64]map[string]bool{}, muted: make(chan struct{})}
}

func (s *signLog) record(signer string, round uint64, head cid.Cid) {
	if s.signed[signer] == nil {
		s.signed[signer] = map[uint64]map[string]bool{}
	}
	if s.signed[signer][round] == nil {
		s.signed[signer][round] = map[string]bool{}
	}
	s.signed[signer][round][head.String()] = true
}

// option decorates validator self's bus; each start of the node makes a new one, which
// only the first start's can be muted.
func (s *signLog) option(self string) fx.Option {
	return fx.Decorate(func(b bus.Bus) bus.Bus { return &signLogBus{Bus: b, log: s, self: self} })
}

type signLogBus struct {
	bus.Bus
	log   *signLog
	self  string
	muted bool
}

func (b *signLogBus) Publish(ctx context.Context, msg any) error {
	s := b.log
	s.mu.Lock()
	switch m := msg.(type) {
	case *gossip.Head:
		if h, err := m.Signed.Decode(); err == nil && chain.FindSignature(m.Signed.Sigs, b.self) != nil {
			s.record(b.self, h.Round, m.Signed.ID())
			if m.Proposal != nil && h.Round == s.stalled && len(m.Signed.Sigs) == 1 && s.victim == "" {
				s.victim, b.muted = b.self, true
				close(s.muted)
			}
		}
	case *gossip.Attestation:
		if id, err := cid.Cast(m.Head); err == nil && m.Sig.Peer == b.self {
			s.record(b.self, m.Round, id)
		}
	}
	muted := b.muted
	s.mu.Unlock()
	if muted {
		return nil
	}
	return b.Bus.Publish(ctx, msg)
}

// TestRestartedLeaderSignsNoSecondHead: the leader of round 2 proposes, its proposal is
// lost (its process publishes nothing more) and it is killed before any quorum, then
// restarted on the same store at once. It finds its lock of round 2 in validator.LocksFile: it
// re-publishes the head it proposed and waits for that round's quorum, instead of leading
// the round again. Every head signature any validator published, before and after the
// restart, names one head per round, no two heads of a round are signed by one validator in
// any node's head store, and the swarm finishes its rounds on one chain. Before the locks
// were kept on disk the restarted leader led round 2 afresh and signed a second head of it.
func TestRestartedLeaderSignsNoSecondHead(t *testing.T) {
	const rounds, stalled = 4, 2
	c, validators, _ := takeoverCluster(t, rounds)
	hook := newSignLog(stalled)
	for _, n := range c.nodes {
		n.cfg.Lease.MinGroup = 3
		n.logs = &syncBuffer{}
		if strings.HasPrefix(n.name, "validator") {
			n.extra = append(n.extra, hook.option(n.host.ID().String()))
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.nodes {
				t.Logf("%s:\n%s", n.name, nodeLines(n.logs.String()))
			}
		}
	})
	c.startAll()
	select {
	case <-hook.muted:
	case <-time.After(2 * time.Minute):
		t.Fatalf("nobody proposed a head of round %d", stalled)
	}
	hook.mu.Lock()
	victimID := hook.victim
	hook.mu.Unlock()
	i := slices.IndexFunc(validators, func(n *clusterNode) bool { return n.host.ID().String() == victimID })
	require.GreaterOrEqual(t, i, 0)
	victim := validators[i]
	c.kill(victim)
	c.restart(victim)
	c.waitDone(3 * time.Minute)
	c.requireOneChain(c.nodes, rounds)
	c.requireNoConflictingQuorums(2)

	restored := slices.ContainsFunc(strings.Split(victim.logs.String(), "\n"), func(l string) bool {
		return strings.Contains(l, `msg="restored signing lock`) && strings.Contains(l, fmt.Sprintf(" round=%d ", stalled))
	})
	require.True(t, restored, "%s restarted without its lock of round %d", victim.name, stalled)
	fi, err := os.Stat(filepath.Join(victim.cfg.Node.StoreDir, validator.LocksFile))
	require.NoError(t, err)
	t.Logf("%s's %s: %d bytes after %d rounds", victim.name, validator.LocksFile, fi.Size(), rounds)
	hook.mu.Lock()
	defer hook.mu.Unlock()
	for signer, byRound := range hook.signed {
		for r, heads := range byRound {
			require.Len(t, heads, 1, "validator %s published signatures of %d heads of round %d: %v", signer, len(heads), r, slices.Collect(maps.Keys(heads)))
		}
	}
	require.NotEmpty(t, hook.signed[victimID][stalled])
}
