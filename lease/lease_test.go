package lease

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
)

// merged are contributions of the ledger's epoch with the given microshards.
func merged(lists ...[]uint32) []chain.Contribution {
	var out []chain.Contribution
	for _, ms := range lists {
		out = append(out, chain.Contribution{Microshards: ms})
	}
	return out
}

func TestApplyConsumesOnceAndRollsEpochs(t *testing.T) {
	l := NewLedger("plan", 5)
	require.Equal(t, []uint32{0, 1, 2, 3, 4}, Available(l))

	l, err := Apply(l, merged([]uint32{1, 3}, []uint32{0}))
	require.NoError(t, err)
	require.Equal(t, []uint32{2, 4}, Available(l))
	require.Equal(t, 3, Count(l))

	_, err = Apply(l, merged([]uint32{3}))
	require.ErrorIs(t, err, ErrDuplicate)
	_, err = Apply(l, merged([]uint32{2}, []uint32{2}))
	require.ErrorIs(t, err, ErrDuplicate, "the same microshard twice in one merge")
	_, err = Apply(l, merged([]uint32{9}))
	require.ErrorContains(t, err, "out of range")
	require.Equal(t, []uint32{2, 4}, Available(l), "a failed Apply changes nothing")

	l, err = Apply(l, merged([]uint32{2, 4}))
	require.NoError(t, err)
	require.Equal(t, uint64(1), l.Epoch, "all consumed: next epoch")
	require.Equal(t, 0, Count(l))
	require.Len(t, Available(l), 5)
}

func TestApplyAheadStartsTheNextEpochWithIt(t *testing.T) {
	ahead := func(ms ...uint32) chain.Contribution { return chain.Contribution{Microshards: ms, Ahead: true} }
	l := NewLedger("plan", 4)
	l, err := Apply(l, merged([]uint32{0, 1}))
	require.NoError(t, err)
	require.Nil(t, l.Ahead, "nothing consumed ahead: no bitmap, the head encodes as it always did")

	// The epoch's last two are leased now, and the trainer that got none of them was leased
	// microshard 1 of the next epoch; both merged in one head.
	l, err = Apply(l, []chain.Contribution{{Microshards: []uint32{3}}, ahead(1)})
	require.NoError(t, err)
	require.Equal(t, uint64(0), l.Epoch, "microshard 2 is not merged yet")
	require.Equal(t, []uint32{2}, Available(l))
	require.Equal(t, []uint32{0, 2, 3}, AvailableAhead(l))
	_, err = Apply(l, []chain.Contribution{ahead(1)})
	require.ErrorIs(t, err, ErrDuplicate, "consumed ahead already")
	_, err = Apply(l, []chain.Contribution{ahead(4)})
	require.ErrorContains(t, err, "out of range")

	l, err = Apply(l, []chain.Contribution{{Microshards: []uint32{2}}, ahead(0)})
	require.NoError(t, err)
	require.Equal(t, uint64(1), l.Epoch)
	require.Equal(t, []uint32{2, 3}, Available(l), "the new epoch starts with what was consumed of it ahead")
	require.Nil(t, l.Ahead)
	require.Len(t, AvailableAhead(l), 4)
}

func TestAssign(t *testing.T) {
	avail := make([]uint32, 100)
	for i := range avail {
		avail[i] = uint32(i)
	}
	cases := []struct {
		name       string
		avail      []uint32
		trainers   []Trainer
		per        int
		wantCounts map[string]int
	}{
		{"equal", avail, []Trainer{{Peer: "a", Capacity: 10}, {Peer: "b", Capacity: 10}, {Peer: "c", Capacity: 10}}, 4, map[string]int{"a": 4, "b": 4, "c": 4}},
		{"proportional to capacity", avail, []Trainer{{Peer: "fast", Capacity: 30}, {Peer: "slow", Capacity: 10}}, 4, map[string]int{"fast": 6, "slow": 2}},
		{"unknown capacity counts as average", avail, []Trainer{{Peer: "a", Capacity: 0}, {Peer: "b", Capacity: 0}}, 3, map[string]int{"a": 3, "b": 3}},
		{"scarce: everyone gets one first", avail[:3], []Trainer{{Peer: "a", Capacity: 100}, {Peer: "b", Capacity: 1}, {Peer: "c", Capacity: 1}}, 4, map[string]int{"a": 1, "b": 1, "c": 1}},
		{"scarce: the fastest get the rest", avail[:5], []Trainer{{Peer: "a", Capacity: 100}, {Peer: "b", Capacity: 1}, {Peer: "c", Capacity: 1}}, 4, map[string]int{"a": 3, "b": 1, "c": 1}},
		{"fewer shards than trainers", avail[:2], []Trainer{{Peer: "a", Capacity: 1}, {Peer: "b", Capacity: 5}, {Peer: "c", Capacity: 3}}, 4, map[string]int{"b": 1, "c": 1}},
		// At an epoch's tail, trainers with merged contributions come before faster claims.
		{"fewer shards than trainers: proven first", avail[:2], []Trainer{{Peer: "a", Capacity: 1, Proven: true}, {Peer: "b", Capacity: 50}, {Peer: "c", Capacity: 3, Proven: true}}, 4, map[string]int{"a": 1, "c": 1}},
		{"one shard: the proven one, not the fastest", avail[:1], []Trainer{{Peer: "attacker", Capacity: 1000}, {Peer: "honest", Capacity: 10, Proven: true}}, 4, map[string]int{"honest": 1}},
		{"nothing left", nil, []Trainer{{Peer: "a", Capacity: 1}}, 4, map[string]int{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Assign(tc.avail, tc.trainers, tc.per, []byte("seed"))
			counts := map[string]int{}
			seen := map[uint32]bool{}
			for p, shards := range got {
				counts[p] = len(shards)
				require.True(t, slices.IsSorted(shards))
				for _, s := range shards {
					require.False(t, seen[s], "microshard %d leased twice", s)
					seen[s] = true
					require.Contains(t, tc.avail, s)
				}
			}
			require.Equal(t, tc.wantCounts, counts)
			again := Assign(tc.avail, slices.Clone(tc.trainers), tc.per, []byte("seed"))
			require.Equal(t, got, again, "deterministic")
		})
	}
}

func TestAssignOrderDependsOnSeed(t *testing.T) {
	avail := []uint32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	a := Assign(avail, []Trainer{{Peer: "t", Capacity: 1}}, 4, []byte("round-1"))
	b := Assign(avail, []Trainer{{Peer: "t", Capacity: 1}}, 4, []byte("round-2"))
	require.NotEqual(t, a["t"], b["t"])
}

// A lease never exceeds MaxLeaseMicroshards, however fast its trainer, and a round never
// leases more than its budget: the bounds that keep lease messages inside their topics.
func TestAssignKeepsTheMessageBounds(t *testing.T) {
	avail := make([]uint32, MaxRoundMicroshards+MaxLeaseMicroshards)
	for i := range avail {
		avail[i] = uint32(i)
	}
	total := func(plan map[string][]uint32) (n, most int) {
		for _, s := range plan {
			n, most = n+len(s), max(most, len(s))
		}
		return n, most
	}
	// One trainer 63 times the others' speed, at the largest per-trainer setting.
	fleet := []Trainer{{Peer: "fast", Capacity: 63}}
	for i := range 63 {
		fleet = append(fleet, Trainer{Peer: fmt.Sprintf("t%02d", i), Capacity: 1})
	}
	plan := Assign(avail, fleet, MaxLeaseMicroshards, []byte("s"))
	n, most := total(plan)
	require.Equal(t, MaxLeaseMicroshards, most, "the fast trainer's share is capped")
	require.LessOrEqual(t, n, MaxRoundMicroshards)
	require.Len(t, plan, 64, "everyone still gets work")

	// Every share capped by the round: proportional shares of the round's bound.
	plan = Assign(avail, fleet[1:], MaxLeaseMicroshards, []byte("s"))
	n, _ = total(plan)
	require.Equal(t, MaxRoundMicroshards, n)

	// A later attempt gets what is left of the round.
	plan = AssignWithin(avail, fleet[1:], 100, 1000, []byte("s"))
	n, _ = total(plan)
	require.Equal(t, 1000, n)
	require.Empty(t, AssignWithin(avail, fleet, 4, 0, []byte("s")), "nothing left")
}

func TestLeadersIsARendezvousOrder(t *testing.T) {
	vs := []string{"v1", "v2", "v3", "v4", "v5"}
	h1 := cids.Record([]byte("head-1"))
	h2 := cids.Record([]byte("head-2"))
	o1 := Leaders(vs, h1)
	require.ElementsMatch(t, vs, o1)
	require.Equal(t, o1, Leaders([]string{"v5", "v3", "v1", "v2", "v4"}, h1), "independent of input order")
	leaders := map[string]bool{}
	for i := range 50 {
		leaders[Leaders(vs, cids.Record([]byte(fmt.Sprint("head-", i))))[0]] = true
	}
	require.Greater(t, len(leaders), 2, "leadership rotates with the head")
	_ = h2
}

func head(round uint64, parent *chain.Head, ledger chain.Ledger, contribs ...[]uint32) *chain.Head {
	h := &chain.Head{Round: round, Ledger: ledger}
	for i, c := range contribs {
		h.Contributions = append(h.Contributions, chain.Contribution{Peer: fmt.Sprint("p", i), Microshards: c})
	}
	return h
}

func TestAuditProvesExactlyOnce(t *testing.T) {
	g := NewLedger("plan", 4)
	l1, _ := Apply(g, merged([]uint32{0, 1}))
	l2, _ := Apply(l1, merged([]uint32{2}, []uint32{3})) // epoch 1 starts
	l3, _ := Apply(l2, merged([]uint32{3}))
	good := []*chain.Head{head(0, nil, g), head(1, nil, l1, []uint32{0, 1}), head(2, nil, l2, []uint32{2}, []uint32{3}), head(3, nil, l3, []uint32{3})}
	rep, err := Audit(good)
	require.NoError(t, err)
	require.Equal(t, uint64(1), rep.EpochsCompleted)
	require.Equal(t, 1, rep.ConsumedInEpoch)
	require.Equal(t, uint64(5), rep.MicroshardsMerged)
	require.Equal(t, 0, rep.Duplicated)
	require.Equal(t, 0, rep.Lost)

	t.Run("duplicate in an epoch", func(t *testing.T) {
		bad := []*chain.Head{good[0], good[1], head(2, nil, l1, []uint32{1})}
		rep, err := Audit(bad)
		require.ErrorIs(t, err, ErrAudit)
		require.ErrorContains(t, err, "round 2")
		require.Equal(t, 1, rep.Duplicated)
	})
	t.Run("ledger that does not match the merged microshards", func(t *testing.T) {
		bad := []*chain.Head{good[0], head(1, nil, l1, []uint32{0})}
		_, err := Audit(bad)
		require.ErrorIs(t, err, ErrAudit)
	})
	t.Run("epoch ended early", func(t *testing.T) {
		early := chain.Ledger{Plan: "plan", Shards: 4, Epoch: 1, Consumed: []byte{0}}
		rep, err := Audit([]*chain.Head{good[0], head(1, nil, early, []uint32{0, 1})})
		require.ErrorIs(t, err, ErrAudit)
		require.Equal(t, 2, rep.Lost, "microshards 2 and 3 were never consumed in epoch 0")
	})
	t.Run("microshards leased ahead", func(t *testing.T) {
		g := NewLedger("plan", 2)
		a := []chain.Contribution{{Microshards: []uint32{0}}, {Peer: "p1", Microshards: []uint32{0}, Ahead: true}}
		l1, err := Apply(g, a)
		require.NoError(t, err)
		h1 := &chain.Head{Round: 1, Ledger: l1, Contributions: a}
		b := []chain.Contribution{{Microshards: []uint32{1}}, {Peer: "p1", Microshards: []uint32{1}, Ahead: true}}
		l2, err := Apply(l1, b)
		require.NoError(t, err)
		h2 := &chain.Head{Round: 2, Ledger: l2, Contributions: b}
		rep, err := Audit([]*chain.Head{head(0, nil, g), h1, h2})
		require.NoError(t, err)
		require.Equal(t, uint64(1), rep.EpochsCompleted)
		require.Equal(t, 2, rep.ConsumedInEpoch, "epoch 1 was consumed while epoch 0 ended")
		require.Equal(t, uint64(4), rep.MicroshardsMerged)
		require.Equal(t, uint64(2), rep.MicroshardsAhead)

		twice := slices.Clone(a)
		twice[1].Ahead = false
		_, err = Audit([]*chain.Head{head(0, nil, g), {Round: 1, Ledger: l1, Contributions: twice}})
		require.ErrorIs(t, err, ErrAudit, "microshard 0 twice in epoch 0")
		lied := l1
		lied.Ahead = nil
		_, err = Audit([]*chain.Head{head(0, nil, g), {Round: 1, Ledger: lied, Contributions: a}})
		require.ErrorIs(t, err, ErrAudit, "a ledger that forgets what was consumed ahead")
	})
	t.Run("not from genesis", func(t *testing.T) {
		_, err := Audit(good[1:])
		require.ErrorIs(t, err, ErrAudit)
	})
}

func TestLeaseCheck(t *testing.T) {
	baseID := cids.Record([]byte("base"))
	ledger, _ := Apply(NewLedger("plan", 8), merged([]uint32{0}))
	base := &chain.Head{Round: 4, Ledger: ledger}
	ok := Lease{Round: 5, Base: baseID.Bytes(), Trainer: "t", Microshards: []uint32{1, 2}, Issuer: "v"}
	require.NoError(t, ok.Check(baseID, base))
	cases := map[string]func(l *Lease){
		"other base":      func(l *Lease) { l.Base = cids.Record([]byte("x")).Bytes() },
		"wrong round":     func(l *Lease) { l.Round = 6 },
		"wrong epoch":     func(l *Lease) { l.Epoch = 2 },
		"ahead reserving": func(l *Lease) { l.Epoch, l.Next, l.NextSteps = 1, []uint32{3}, 4 },
		"consumed shard":  func(l *Lease) { l.Microshards = []uint32{0, 1} },
		"out of range":    func(l *Lease) { l.Microshards = []uint32{9} },
		"unsorted":        func(l *Lease) { l.Microshards = []uint32{2, 1} },
		"duplicate":       func(l *Lease) { l.Microshards = []uint32{1, 1} },
		"empty":           func(l *Lease) { l.Microshards = nil },
		// A reservation (protocol.overlap: eager) is checked too.
		"next without steps": func(l *Lease) { l.Next = []uint32{3} },
		"steps without next": func(l *Lease) { l.NextSteps = 4 },
		"next unsorted":      func(l *Lease) { l.Next, l.NextSteps = []uint32{4, 3}, 4 },
		"next duplicate":     func(l *Lease) { l.Next, l.NextSteps = []uint32{3, 3}, 4 },
		"next out of range":  func(l *Lease) { l.Next, l.NextSteps = []uint32{8}, 4 },
		"next leased now":    func(l *Lease) { l.Next, l.NextSteps = []uint32{2, 3}, 4 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			l := ok
			l.Microshards = slices.Clone(ok.Microshards)
			mutate(&l)
			require.ErrorIs(t, l.Check(baseID, base), ErrInvalid)
		})
	}
	require.NotEqual(t, ok.ID(), (&Lease{Round: 5, Base: baseID.Bytes(), Trainer: "u", Microshards: []uint32{1, 2}, Issuer: "v"}).ID())
	reserving := ok
	reserving.Next, reserving.NextSteps = []uint32{3, 7}, 4
	require.NoError(t, reserving.Check(baseID, base))
	require.NotEqual(t, ok.ID(), reserving.ID(), "the reservation is part of the lease's id")

	// A lease of the next epoch: its microshards need only be free in that epoch.
	ahead := ok
	ahead.Epoch, ahead.Microshards = 1, []uint32{0, 5}
	require.True(t, ahead.Ahead(base))
	require.False(t, ok.Ahead(base))
	require.NoError(t, ahead.Check(baseID, base), "microshard 0 is consumed in epoch 0, not in epoch 1")
	aheadBase := &chain.Head{Round: 4, Ledger: chain.Ledger{Plan: "plan", Shards: 8, Consumed: []byte{0x01}, Ahead: []byte{0x20}}}
	require.ErrorIs(t, ahead.Check(baseID, aheadBase), ErrInvalid, "microshard 5 was consumed ahead")

	// A ledger whose bitmap is shorter than its shard count (a head built in memory, not
	// decoded) leases nothing past the bitmap, and panics nowhere.
	short := &chain.Head{Round: 4, Ledger: chain.Ledger{Plan: "plan", Shards: 16, Consumed: []byte{0x01}}}
	require.NoError(t, ok.Check(baseID, short))
	beyond := ok
	beyond.Microshards = []uint32{8}
	require.ErrorIs(t, beyond.Check(baseID, short), ErrInvalid)
	require.Equal(t, []uint32{1, 2, 3, 4, 5, 6, 7}, Available(short.Ledger))
	// Nor one with more bits set than shards.
	require.Equal(t, []uint32{}, Available(chain.Ledger{Shards: 4, Consumed: []byte{0xff}}))
}

func TestStepsScaleWithCapacity(t *testing.T) {
	got := Steps([]Trainer{{Peer: "fast", Capacity: 30}, {Peer: "avg", Capacity: 20}, {Peer: "slow", Capacity: 10}, {Peer: "new", Capacity: 0}}, 20)
	require.Equal(t, map[string]int{"fast": 30, "avg": 20, "slow": 10, "new": 20}, got)
	got = Steps([]Trainer{{Peer: "huge", Capacity: 10000}, {Peer: "tiny", Capacity: 1}, {Peer: "t2", Capacity: 1}, {Peer: "t3", Capacity: 1}}, 8)
	require.Equal(t, 32, got["huge"], "at most four times")
	require.Equal(t, 2, got["tiny"], "at least a quarter")
	require.Equal(t, map[string]int{"a": 5}, Steps([]Trainer{{Peer: "a", Capacity: 0}}, 5))
	require.Equal(t, map[string]int{"a": 20, "b": 20}, Steps([]Trainer{{Peer: "a", Capacity: 11}, {Peer: "b", Capacity: 9}}, 20), "close capacities: measurement noise")
}

// A trainer with two ranks reads two batches a step: at the per-rank speed of two
// one-rank trainers it has twice their capacity, and gets twice their microshards but
// the same steps, so its window takes as long as theirs and reads each example once.
func TestTwoRankTrainerGetsTwiceTheDataNotTwiceTheSteps(t *testing.T) {
	ts := []Trainer{{Peer: "a-two-ranks", Capacity: 64, SamplesPerStep: 16}, {Peer: "b", Capacity: 32, SamplesPerStep: 8}, {Peer: "c", Capacity: 32, SamplesPerStep: 8}}
	require.Equal(t, map[string]int{"a-two-ranks": 20, "b": 20, "c": 20}, Steps(ts, 20))
	all := make([]uint32, 100)
	for i := range all {
		all[i] = uint32(i)
	}
	got := Assign(all, ts, 4, []byte("seed"))
	require.Len(t, got["a-two-ranks"], 2*len(got["b"]))
	require.Len(t, got["b"], len(got["c"]))
	// Before its first window it is taken to read what the others do: capacity alone.
	ts[0].SamplesPerStep = 0
	require.Equal(t, 30, Steps(ts, 20)["a-two-ranks"])
}

func TestDeadlineFollowsKnownPace(t *testing.T) {
	floor, ceiling, unknown := 5*time.Second, 10*time.Minute, 30*time.Second
	bounds := Timing{Floor: floor, Ceiling: ceiling, Unknown: unknown}
	cases := []struct {
		name   string
		paces  []Pace
		timing Timing
		want   time.Duration
	}{
		{"nothing known, no default: the ceiling", []Pace{{Peer: "a", Steps: 20}}, Timing{Floor: floor, Ceiling: ceiling}, ceiling},
		{"nothing known: the default", []Pace{{Peer: "a", Steps: 20}}, bounds, unknown},
		{"nothing known, the default missed: twice the default", []Pace{{Peer: "a", Steps: 20, Missed: unknown}}, bounds, 2 * unknown},
		{"nothing known, twice the default missed: four times it", []Pace{{Peer: "a", Steps: 20, Missed: 2 * unknown}, {Peer: "b", Steps: 20}}, bounds, 4 * unknown},
		{"missed deadlines double up to the ceiling", []Pace{{Peer: "a", Steps: 20, Missed: ceiling}}, bounds, ceiling},
		{"a missed deadline past any ceiling does not overflow", []Pace{{Peer: "a", Steps: 20, Missed: math.MaxInt64}}, bounds, ceiling},
		{"default below the floor", []Pace{{Peer: "a", Steps: 20}}, Timing{Floor: floor, Ceiling: ceiling, Unknown: time.Second}, floor},
		// slowest window 20 steps × 1 s = 20 s → 3 × 20 + 2 = 62 s
		{"observed", []Pace{{Peer: "a", SecondsPerStep: 0.5, Steps: 20}, {Peer: "b", SecondsPerStep: 1, Steps: 20}}, bounds, 62 * time.Second},
		{"an unseen trainer runs at the median pace", []Pace{{Peer: "a", SecondsPerStep: 1, Steps: 10}, {Peer: "new", Steps: 40}}, bounds, 122 * time.Second},
		{"announced (probed) pace, nothing observed: steps × pace", []Pace{{Peer: "a", Announced: 0.25, Steps: 40}}, bounds, 32 * time.Second},
		// Paces observed on an idle machine are stale once it is loaded: a trainer that let a
		// deadline pass gets twice it, whatever its pace says.
		{"known pace, its deadline missed: twice it", []Pace{{Peer: "a", Announced: 0.25, Steps: 40, Missed: 32 * time.Second}}, bounds, 64 * time.Second},
		{"fast, the floor missed: twice the floor", []Pace{{Peer: "a", SecondsPerStep: 0.001, Steps: 10, Missed: floor}}, bounds, 2 * floor},
		{"a missed deadline shorter than the pace's changes nothing", []Pace{{Peer: "a", SecondsPerStep: 1, Steps: 20, Missed: 10 * time.Second}, {Peer: "b", SecondsPerStep: 1, Steps: 20}}, bounds, 62 * time.Second},
		{"known pace, missed deadlines stop at the ceiling", []Pace{{Peer: "a", SecondsPerStep: 1, Steps: 20, Missed: 8 * time.Minute}}, bounds, ceiling},
		{"observed beats announced", []Pace{{Peer: "a", SecondsPerStep: 1, Announced: 0.01, Steps: 20}}, bounds, 62 * time.Second},
		{"a claim of speed shortens only its own term", []Pace{{Peer: "a", SecondsPerStep: 1, Steps: 20}, {Peer: "liar", Announced: 1e-9, Steps: 20}}, bounds, 62 * time.Second},
		{"a claim of slowness stops at the ceiling", []Pace{{Peer: "a", Announced: 1e12, Steps: 20}}, bounds, ceiling},
		{"non-finite figures are unknown", []Pace{{Peer: "a", SecondsPerStep: math.NaN(), Announced: math.Inf(1), Steps: 20}}, bounds, unknown},
		{"fast: the floor", []Pace{{Peer: "a", SecondsPerStep: 0.001, Steps: 10}}, bounds, floor},
		{"slow: the ceiling", []Pace{{Peer: "a", SecondsPerStep: 100, Steps: 100}}, bounds, ceiling},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, Deadline(tc.paces, tc.timing))
		})
	}
}

func TestQuarantine(t *testing.T) {
	q := NewQuarantine(2, 5, 3)
	require.False(t, q.Reject("bad", 1, false))
	require.True(t, q.Reject("bad", 3, false), "second rejection within the window")
	require.True(t, q.Quarantined("bad", 4))
	require.True(t, q.Quarantined("bad", 6))
	require.False(t, q.Quarantined("bad", 7), "served its rounds")
	require.Equal(t, map[string]uint64{"bad": 6}, q.List(5))
	require.False(t, q.Reject("slow", 1, false))
	require.False(t, q.Reject("slow", 10, false), "rejections far apart do not add up")
	require.False(t, NewQuarantine(1, 5, 0).Reject("x", 1, false), "rounds 0 disables it")

	// Soft rejections count half: four within the window, or two and a hard one.
	for r := uint64(1); r <= 3; r++ {
		require.False(t, q.Reject("odd", r, true), "soft rejection %d", r)
	}
	require.True(t, q.Reject("odd", 4, true), "fourth soft rejection")
	require.False(t, q.Reject("mixed", 1, true))
	require.False(t, q.Reject("mixed", 2, true))
	require.True(t, q.Reject("mixed", 3, false))
	require.False(t, q.Reject("rare", 1, true))
	require.False(t, q.Reject("rare", 4, true))
	require.False(t, q.Reject("rare", 7, true), "the first has left the window")
	require.False(t, q.Reject("rare", 10, true))
}

// TestQuarantineStruck: a peer rejected or missing a lease within the window is struck
// (not served first at an epoch's tail) until the strike leaves the window.
func TestQuarantineStruck(t *testing.T) {
	q := NewQuarantine(2, 5, 3)
	require.False(t, q.Struck("clean", 1))
	q.Reject("odd", 2, true)
	require.True(t, q.Struck("odd", 2))
	require.True(t, q.Struck("odd", 6))
	require.False(t, q.Struck("odd", 7), "the strike has left the window")
	q.Miss("slow", 3)
	require.True(t, q.Struck("slow", 4))
	q.Reject("bad", 1, false)
	q.Reject("bad", 2, false)
	require.False(t, q.Struck("bad", 3), "quarantined, its strikes are spent")
}

func TestQuarantineNeverStallsTheRound(t *testing.T) {
	q := NewQuarantine(1, 5, 10)
	q.Reject("a", 1, false)
	q.Reject("b", 1, false)
	all := []Trainer{{Peer: "a", Capacity: 1}, {Peer: "b", Capacity: 1}, {Peer: "c", Capacity: 1}}
	peers := func(ts []Trainer) []string {
		var out []string
		for _, t := range ts {
			out = append(out, t.Peer)
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		available []Trainer
		have, min int
		want      []string
		relaxed   bool
	}{
		{"quarantined peers are left out", all, 0, 1, []string{"c"}, false},
		{"enough with what was received", all, 1, 2, []string{"c"}, false},
		{"too few for the minimum group", all, 0, 2, []string{"a", "b", "c"}, true},
		{"nobody outside quarantine", all[:2], 0, 1, []string{"a", "b"}, true},
		{"nobody in quarantine", all[2:], 0, 3, []string{"c"}, false},
		{"nobody at all", nil, 0, 1, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, relaxed := q.Eligible(tc.available, 2, tc.have, tc.min)
			require.Equal(t, tc.want, peers(got))
			require.Equal(t, tc.relaxed, relaxed)
		})
	}
	got, relaxed := q.Eligible(all, 12, 0, 3)
	require.Len(t, got, 3, "served their rounds")
	require.False(t, relaxed)
}

func TestOneOf(t *testing.T) {
	cases := []struct {
		name string
		in   []Trainer
		want []string
	}{
		{"none", nil, nil},
		{"first in peer order", []Trainer{{Peer: "c"}, {Peer: "a"}, {Peer: "b"}}, []string{"a"}},
		{"proven first", []Trainer{{Peer: "a"}, {Peer: "c", Proven: true}, {Peer: "b", Proven: true}}, []string{"b"}},
		{"capacity does not count", []Trainer{{Peer: "b", Capacity: 9}, {Peer: "a", Capacity: 1}}, []string{"a"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, peersOf(OneOf(tc.in)))
		})
	}
}
