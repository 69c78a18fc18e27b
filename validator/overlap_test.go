package validator

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/lease"
)

func TestHonourLeasesReservationsThatAreStillAvailable(t *testing.T) {
	work := []lease.Trainer{{Peer: "a", Capacity: 1}, {Peer: "b", Capacity: 1}, {Peer: "c", Capacity: 1}}
	cases := []struct {
		name      string
		res       map[string]reservation
		avail     []uint32
		budget    int
		honoured  map[string][]uint32
		rest      []uint32
		othersLen int
	}{
		{"none reserved", nil, []uint32{1, 2, 3}, 100, map[string][]uint32{}, []uint32{1, 2, 3}, 3},
		{"all honoured", map[string]reservation{"a": {[]uint32{1}, 5}, "b": {[]uint32{2}, 5}, "c": {[]uint32{3, 4}, 5}},
			[]uint32{1, 2, 3, 4, 5}, 100, map[string][]uint32{"a": {1}, "b": {2}, "c": {3, 4}}, []uint32{5}, 0},
		{"a microshard consumed since", map[string]reservation{"a": {[]uint32{1, 9}, 5}, "b": {[]uint32{2}, 5}},
			[]uint32{1, 2, 3}, 100, map[string][]uint32{"b": {2}}, []uint32{1, 3}, 2},
		{"reserved for a peer not among the candidates", map[string]reservation{"z": {[]uint32{1}, 5}},
			[]uint32{1, 2}, 100, map[string][]uint32{}, []uint32{1, 2}, 3},
		{"over the round's budget", map[string]reservation{"a": {[]uint32{1, 2}, 5}, "b": {[]uint32{3}, 5}},
			[]uint32{1, 2, 3}, 1, map[string][]uint32{"b": {3}}, []uint32{1, 2}, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan, steps, rest, others := honour(tc.res, tc.avail, work, tc.budget)
			require.Equal(t, tc.honoured, plan)
			require.Equal(t, tc.rest, rest)
			require.Len(t, others, tc.othersLen)
			for p := range plan {
				require.Equal(t, tc.res[p].steps, steps[p], "the reserved steps go with the reservation")
			}
		})
	}
}

func TestReserveDrawsFromWhatTheRoundLeaves(t *testing.T) {
	work := []lease.Trainer{{Peer: "a", Capacity: 1}, {Peer: "b", Capacity: 1}, {Peer: "idle", Capacity: 1}}
	avail := []uint32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	plan := map[string][]uint32{"a": {0, 1}, "b": {2, 3}}
	next, steps := reserve(avail, plan, work, 2, 100, 20, []byte("seed"))
	require.Len(t, next, 2, "only the peers leased now reserve")
	seen := map[uint32]bool{0: true, 1: true, 2: true, 3: true}
	for p, ms := range next {
		require.Len(t, ms, 2, p)
		require.Equal(t, 20, steps[p])
		for _, s := range ms {
			require.False(t, seen[s], "microshard %d reserved twice or leased now", s)
			seen[s] = true
		}
	}

	// The next round is the epoch's last full one, with a leftover of half a round: it
	// takes the leftover with it, in longer windows (lease.AbsorbTail).
	next, steps = reserve(avail[:10], plan, work, 2, 100, 20, []byte("seed"))
	require.Len(t, next, 2)
	for p, ms := range next {
		require.Len(t, ms, 3, p)
		require.Equal(t, 30, steps[p])
	}

	// Short of microshards (an epoch's tail): fewer, with fewer steps; none left: nothing.
	next, steps = reserve([]uint32{0, 1, 2, 3, 4}, plan, work, 2, 100, 20, []byte("seed"))
	total := 0
	for p, ms := range next {
		total += len(ms)
		if len(ms) < 2 {
			require.Less(t, steps[p], 20)
		}
	}
	require.Equal(t, 1, total)
	next, _ = reserve([]uint32{0, 1, 2, 3}, plan, work, 2, 100, 20, []byte("seed"))
	require.Empty(t, next)

	// Within what the round's bound leaves.
	next, _ = reserve(avail, plan, work, 2, 1, 20, []byte("seed"))
	total = 0
	for _, ms := range next {
		total += len(ms)
	}
	require.Equal(t, 1, total)
}

// A round that leases its epoch's last microshards reserves from the next epoch's: all of
// the plan but what it leases now and what its received updates reserved.
func TestNextPoolRollsOverTheEpoch(t *testing.T) {
	// An epoch of 12: the next round's pool (11 without c's reservation) holds more than a
	// round and a half of shares of 2, so no leftover is absorbed (lease.AbsorbTail).
	r := &openRound{base: &chain.Head{Ledger: chain.Ledger{Shards: 12}}, fetches: &deltaFetches{pending: map[string]pendingFetch{}},
		received: map[string]received{"c": {lease: lease.Lease{Next: []uint32{6}}}}}
	require.Equal(t, []uint32{4, 5}, r.nextPool([]uint32{4, 5}, map[string][]uint32{"a": {4}}, nil), "microshards are left in the epoch")
	pool := r.nextPool([]uint32{4, 5}, map[string][]uint32{"a": {4}, "b": {5}}, nil)
	require.Equal(t, []uint32{0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11}, pool)
	next, _ := reserve(pool, map[string][]uint32{"a": {4}, "b": {5}}, []lease.Trainer{{Peer: "a", Capacity: 1}, {Peer: "b", Capacity: 1}}, 2, 100, 20, []byte("s"))
	for _, ms := range next {
		require.Len(t, ms, 2)
		require.NotContains(t, ms, uint32(4))
		require.NotContains(t, ms, uint32(5))
		require.NotContains(t, ms, uint32(6))
	}
}
