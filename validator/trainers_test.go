package validator

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
)

// TestTrainerSetCountsReturns: a trainer counts as come back (its lease in the open round
// is lost) when it announces a new process start, or after a gap in its own announcements
// longer than gossip.LiveFor — not when the validator merely read a backlog late, not for a
// first announcement, not for an old announcement delivered after newer ones, and not for
// a gap that began before the validator had listened for gossip.LiveFor (announcements it missed
// while starting).
func TestTrainerSetCountsReturns(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	ann := func(at time.Time, started int64) *gossip.Announce {
		return &gossip.Announce{Peer: "p", Roles: []string{config.RoleTrainer}, Time: at.UnixMilli(), Started: started}
	}
	type seen struct {
		read time.Time // when the validator reads it
		a    *gossip.Announce
	}
	cases := []struct {
		name string
		seq  []seen // an entry without an announcement: the validator began to listen then (else a minute before t0)
		want int
		how  string // what the leader logs of the last return
	}{
		{"first announcement", []seen{{t0, ann(t0, 1)}}, 0, ""},
		{"steady", []seen{{t0, ann(t0, 1)}, {t0.Add(2 * time.Second), ann(t0.Add(2*time.Second), 1)}}, 0, ""},
		{"restarted", []seen{{t0, ann(t0, 1)}, {t0.Add(3 * time.Second), ann(t0.Add(3*time.Second), 2)}}, 1, "restarted"},
		{"silent for longer than gossip.LiveFor", []seen{{t0, ann(t0, 1)}, {t0.Add(gossip.LiveFor + 2*time.Second), ann(t0.Add(gossip.LiveFor+2*time.Second), 1)}}, 1, "silent for 8s"},
		{"a backlog read late is no silence", []seen{
			{t0, ann(t0, 1)},
			{t0.Add(20 * time.Second), ann(t0.Add(2*time.Second), 1)},
			{t0.Add(20 * time.Second), ann(t0.Add(4*time.Second), 1)},
		}, 0, ""},
		{"an old node without a start time", []seen{{t0, ann(t0, 0)}, {t0.Add(2 * time.Second), ann(t0.Add(2*time.Second), 0)}}, 0, ""},
		{"an old announcement delivered after newer ones", []seen{
			{t0.Add(2 * time.Second), ann(t0.Add(2*time.Second), 1)},
			{t0.Add(4 * time.Second), ann(t0.Add(4*time.Second), 1)},
			{t0.Add(4 * time.Second), ann(t0, 1)},
			{t0.Add(6 * time.Second), ann(t0.Add(gossip.LiveFor+10*time.Millisecond), 1)},
		}, 0, ""},
		{"an old announcement of the previous process is no second restart", []seen{
			{t0, ann(t0, 1)},
			{t0.Add(3 * time.Second), ann(t0.Add(3*time.Second), 2)},
			{t0.Add(3 * time.Second), ann(t0.Add(time.Second), 1)},
			{t0.Add(5 * time.Second), ann(t0.Add(5*time.Second), 2)},
		}, 1, "restarted"},
		{"missed while the validator started", []seen{
			{t0.Add(2 * time.Second), nil},
			{t0.Add(3 * time.Second), ann(t0, 1)},
			{t0.Add(6 * time.Second), ann(t0.Add(gossip.LiveFor+10*time.Millisecond), 1)},
		}, 0, ""},
		{"silent once the validator had listened", []seen{
			{t0.Add(2 * time.Second), nil},
			{t0.Add(3 * time.Second), ann(t0, 1)},
			{t0.Add(8 * time.Second), ann(t0.Add(8*time.Second), 1)},
			{t0.Add(16 * time.Second), ann(t0.Add(16*time.Second), 1)},
		}, 1, "silent for 8s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTrainerSet()
			ts.since = t0.Add(-time.Minute)
			for _, s := range tc.seq {
				if s.a == nil {
					ts.since = s.read
					continue
				}
				ts.now = func() time.Time { return s.read }
				ts.seen("p", s.a)
			}
			require.Equal(t, tc.want, ts.returns("p"))
			require.Equal(t, tc.how, ts.returnedHow("p"))
		})
	}
}

// TestTrainerSetTakesCapacityFromContributions: an accepted contribution's speed replaces a
// trainer's announced capacity at once (rounds can be shorter than the announce interval),
// for trainers heard from only; a contribution without a training time changes nothing.
func TestTrainerSetTakesCapacityFromContributions(t *testing.T) {
	ts := newTrainerSet()
	ts.seen("p", &gossip.Announce{Peer: "p", Roles: []string{config.RoleTrainer}, Time: 1, Capacity: 0})
	ts.measured("p", 32, 0.002, 4)
	ts.measured("q", 32, 0.004, 4) // never announced: not a live trainer
	ts.measured("p", 32, 0, 4)     // no training time: ignored
	live := ts.live()
	require.Len(t, live, 1)
	require.Equal(t, "p", live[0].Peer)
	require.InDelta(t, 16000.0, live[0].Capacity, 1e-9)
	require.InDelta(t, 8.0, live[0].SamplesPerStep, 1e-9, "32 samples in 4 steps")
}

func TestWorkCandidatesKeepHFixed(t *testing.T) {
	cands := []lease.Trainer{{Peer: "a", Capacity: 100, Proven: true}, {Peer: "b", Capacity: 260}, {Peer: "c", Capacity: 40}}
	avail := make([]uint32, 30)
	for i := range avail {
		avail[i] = uint32(i)
	}
	for _, tc := range []struct {
		proportional bool
		steps        map[string]int
		shards       map[string]int
	}{
		{false, map[string]int{"a": 20, "b": 20, "c": 20}, map[string]int{"a": 3, "b": 3, "c": 3}},
		{true, map[string]int{"a": 15, "b": 39, "c": 6}, map[string]int{"a": 2, "b": 6, "c": 1}},
	} {
		work := workCandidates(cands, tc.proportional)
		steps := lease.Steps(work, 20)
		plan := lease.Assign(avail, work, 3, []byte("seed"))
		for p, want := range tc.steps {
			if steps[p] != want {
				t.Errorf("proportional=%v: %s gets %d steps, want %d", tc.proportional, p, steps[p], want)
			}
			if got := len(plan[p]); got != tc.shards[p] {
				t.Errorf("proportional=%v: %s gets %d microshards, want %d", tc.proportional, p, got, tc.shards[p])
			}
		}
	}
	if cands[1].Capacity != 260 {
		t.Fatal("workCandidates changed its input")
	}
}

// TestTrainerSetTellsATrainerCatchingUp: a trainer is behind when its announcement names no
// head while the validator's is past genesis (a joiner downloading the model); one with an
// older head rebuilds the rest in a lease's wait for its base. A contribution it delivered
// says it holds the round's base.
func TestTrainerSetTellsATrainerCatchingUp(t *testing.T) {
	head := func(round uint64) *gossip.Announce {
		return &gossip.Announce{Peer: "p", Roles: []string{config.RoleTrainer}, Time: 1, Head: []byte{1}, Round: round}
	}
	none := &gossip.Announce{Peer: "p", Roles: []string{config.RoleTrainer}, Time: 1}
	for _, tc := range []struct {
		name   string
		tip    int64 // -1: the validator has no head
		a      *gossip.Announce
		behind bool
	}{
		{"its head is the validator's", 5, head(5), false},
		{"a round behind: the head is on its way", 5, head(4), false},
		{"rounds behind", 5, head(1), false},
		{"ahead of the validator", 5, head(7), false},
		{"no head at genesis", 0, none, false},
		{"no head past genesis", 1, none, true},
		{"the validator has no head", -1, head(0), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTrainerSet()
			ts.tip = func() (uint64, bool) { return uint64(max(tc.tip, 0)), tc.tip >= 0 }
			ts.seen("p", tc.a)
			require.Equal(t, tc.behind, ts.isBehind("p"))
			ts.measured("p", 10, 1, 1)
			require.False(t, ts.isBehind("p"), "it delivered a contribution on the round's base")
		})
	}
}
