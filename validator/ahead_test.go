package validator

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
)

// leaseAhead leases a trainer the round had nothing for from the next epoch, and only then:
// not while the epoch has microshards left, nor what the next epoch had consumed or what
// an update of the round took of it.
func TestLeaseAheadOnlyWhenTheEpochHasNothingLeft(t *testing.T) {
	others := []lease.Trainer{{Peer: "a"}, {Peer: "b"}}
	// Epoch 0 of 8; microshards 0 and 1 of epoch 1 consumed already.
	ledger := chain.Ledger{Shards: 8, Consumed: []byte{0x3f}, Ahead: []byte{0x03}}
	cases := []struct {
		name     string
		fresh    map[string][]uint32
		rest     int
		budget   int
		received map[string]received
		want     map[string]int // microshards leased ahead, by trainer
	}{
		{"b got none of the epoch's last two", map[string][]uint32{"a": {6, 7}}, 2, 100, nil, map[string]int{"b": 2}},
		{"neither got any: nothing was left", map[string][]uint32{}, 0, 100, nil, map[string]int{"a": 2, "b": 2}},
		{"microshards of the epoch left over", map[string][]uint32{"a": {6}}, 2, 100, nil, nil},
		{"everyone leased", map[string][]uint32{"a": {6}, "b": {7}}, 2, 100, nil, nil},
		{"no budget left", map[string][]uint32{"a": {6, 7}}, 2, 0, nil, nil},
		{"an update of the round holds most of the next epoch", map[string][]uint32{"a": {6, 7}}, 2, 100,
			map[string]received{"c": {msg: &gossip.Contribution{Microshards: []uint32{2, 3, 4, 5, 6}}, lease: lease.Lease{Epoch: 1}}},
			map[string]int{"b": 1}},
		{"an update of the epoch's own takes nothing of the next", map[string][]uint32{"a": {6, 7}}, 2, 100,
			map[string]received{"c": {msg: &gossip.Contribution{Microshards: []uint32{2, 3, 4, 5, 6}}, lease: lease.Lease{Epoch: 0}}},
			map[string]int{"b": 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &openRound{base: &chain.Head{Ledger: ledger}, received: tc.received, fetches: &deltaFetches{pending: map[string]pendingFetch{}}}
			plan, steps := r.leaseAhead(others, tc.fresh, tc.rest, 2, tc.budget, 20, []byte("seed"))
			got := map[string]int{}
			for p, ms := range plan {
				got[p] = len(ms)
				require.Positive(t, steps[p], p)
				for _, s := range ms {
					require.NotContains(t, []uint32{0, 1}, s, "consumed in the next epoch already")
					if rc, ok := tc.received["c"]; ok && rc.lease.Epoch == 1 {
						require.NotContains(t, rc.msg.Microshards, s, "taken by an update of the round")
					}
				}
			}
			if tc.want == nil {
				require.Empty(t, plan)
				return
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// The next epoch's reservations of a round that leases its epoch's last microshards leave
// out what the round leased of the next epoch, and what that epoch had consumed already.
func TestNextPoolLeavesTheNextEpochsLeasesOut(t *testing.T) {
	r := &openRound{base: &chain.Head{Ledger: chain.Ledger{Shards: 8, Consumed: []byte{0x3f}, Ahead: []byte{0x01}}},
		fetches:  &deltaFetches{pending: map[string]pendingFetch{}},
		received: map[string]received{"c": {msg: &gossip.Contribution{Microshards: []uint32{1}}, lease: lease.Lease{Epoch: 1}}}}
	pool := r.nextPool([]uint32{6, 7}, map[string][]uint32{"a": {6, 7}}, map[string][]uint32{"b": {2, 3}})
	require.Equal(t, []uint32{4, 5, 6, 7}, pool)
}
