package lease

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func bookLeases(round uint64, peers ...string) []Lease {
	var out []Lease
	for i, p := range peers {
		out = append(out, Lease{Round: round, Trainer: p, Microshards: []uint32{uint32(i)}})
	}
	return out
}

func trainers(peers ...string) []Trainer {
	var out []Trainer
	for _, p := range peers {
		out = append(out, Trainer{Peer: p, Capacity: 1})
	}
	return out
}

func peersOf(ts []Trainer) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Peer)
	}
	return out
}

// TestBookBarsFailedPeersForTheRound: each way a lease can fail keeps its trainer out of
// the round's further attempts, and only that trainer.
func TestBookBarsFailedPeersForTheRound(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		name     string
		fail     func(b *Book)
		barred   map[string]string
		settled  bool
		expired  []string
		canLease []string
	}{
		{"contribution rejected at acceptance", func(b *Book) { b.Bar("bad", "no_lease") },
			map[string]string{"bad": "no_lease", "h2": "expired"}, false, []string{"h2"}, []string{"new"}},
		{"lease released", func(b *Book) { b.Bar("bad", "released") },
			map[string]string{"bad": "released", "h2": "expired"}, false, []string{"h2"}, []string{"new"}},
		{"lease expired", func(*Book) {},
			map[string]string{"bad": "expired", "h2": "expired"}, false, []string{"bad", "h2"}, []string{"new"}},
		{"rejected at screening after it reported", func(b *Book) { b.Report("bad"); b.Bar("bad", "norm_outlier") },
			map[string]string{"bad": "norm_outlier", "h2": "expired"}, false, []string{"h2"}, []string{"new"}},
		{"everyone settles before the deadline", func(b *Book) { b.Bar("bad", "released"); b.Report("h2") },
			map[string]string{"bad": "released"}, true, nil, []string{"new"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBook(7, t0)
			ls := bookLeases(7, "bad", "h1", "h2")
			b.Grant(ls)
			require.True(t, b.Holds("bad", ls[0].ID()))
			require.False(t, b.Holds("bad", ls[1].ID()), "a lease of another trainer")
			b.Report("h1")
			tc.fail(b)
			require.Equal(t, tc.settled, b.Settled())
			require.Equal(t, tc.expired, b.Expire())
			require.True(t, b.Settled())
			b.End(t0.Add(time.Second))
			barred := b.Barred()
			for p, why := range tc.barred {
				require.Equal(t, why, barred[p], p)
			}
			require.Len(t, barred, len(tc.barred))
			require.False(t, b.Holds("bad", ls[0].ID()), "a settled lease is no longer held")
			// The barred, the reported and the outsiders: only the new trainer may be leased.
			require.Equal(t, tc.canLease, peersOf(b.Candidates(trainers("bad", "h1", "h2", "new"))))
		})
	}
}

func TestBookBarsOnlyLeasedPeers(t *testing.T) {
	b := NewBook(3, time.Unix(0, 0))
	b.Grant(bookLeases(3, "a"))
	require.False(t, b.Bar("stranger", "no_lease"), "a peer without a lease has nothing to take back")
	require.True(t, b.Bar("a", "lease_mismatch"))
	require.False(t, b.Bar("a", "replay"), "barred once")
	require.Equal(t, map[string]string{"a": "lease_mismatch"}, b.Barred())
	b.Report("a") // a report after the bar settles nothing
	require.Equal(t, []string{"b"}, peersOf(b.Candidates(trainers("a", "b"))))
}

// TestBookNext is the leader's decision table.
func TestBookNext(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const patience = 5 * time.Second
	// prepared books: fresh (no attempt yet); after a clean attempt; after an attempt where a
	// lease failed but another reported; after a fruitless attempt.
	fresh := func() *Book { return NewBook(1, t0) }
	clean := func() *Book {
		b := NewBook(1, t0)
		b.Grant(bookLeases(1, "a", "b"))
		b.Report("a")
		b.Report("b")
		b.End(t0)
		return b
	}
	partial := func() *Book {
		b := NewBook(1, t0)
		b.Grant(bookLeases(1, "a", "bad"))
		b.Report("a")
		b.Bar("bad", "released")
		b.End(t0)
		return b
	}
	fruitless := func() *Book {
		b := NewBook(1, t0)
		b.Grant(bookLeases(1, "bad"))
		b.Bar("bad", "no_lease")
		b.End(t0)
		return b
	}
	cases := []struct {
		name string
		book func() *Book
		at   time.Duration
		s    Situation
		want Step
	}{
		{"waits for a minimum group before the first lease", fresh, 0, Situation{MinGroup: 3, Candidates: 2, Available: 10}, Wait},
		{"leases once the minimum group is live", fresh, 0, Situation{MinGroup: 3, Candidates: 3, Available: 10}, Grant},
		{"nothing to lease", fresh, 0, Situation{MinGroup: 1, Candidates: 3}, Wait},
		{"closes with the minimum group", partial, 0, Situation{Received: 3, MinGroup: 3, Candidates: 5, Available: 10}, Close},
		{"closes when every leased trainer reported (epoch tail)", clean, 0, Situation{Received: 2, MinGroup: 3, Candidates: 1, Available: 4}, Close},
		{"closes when no microshard is left", partial, 0, Situation{Received: 1, MinGroup: 3, Candidates: 2}, Close},
		{"re-leases a failed lease's microshards to a candidate", partial, 0, Situation{Received: 1, MinGroup: 3, Candidates: 1, Barred: 1, Available: 1}, Grant},
		{"never re-leases to the barred: waits", partial, patience / 2, Situation{Received: 1, MinGroup: 3, Barred: 1, Available: 1, Patience: patience}, Wait},
		{"then closes with what passed", partial, patience, Situation{Received: 1, MinGroup: 3, Barred: 1, Available: 1, Patience: patience}, Close},
		{"after a failed attempt, the others get its microshards at once", fruitless, 0, Situation{MinGroup: 1, Candidates: 1, Barred: 1, Available: 1}, Grant},
		{"everyone barred, nothing received: a new pass after the backoff", fruitless, DefaultBackoff, Situation{MinGroup: 1, Barred: 1, Available: 1}, NewPass},
		{"after a failed attempt, fewer than the minimum group get the microshards", fruitless, 0, Situation{MinGroup: 3, Candidates: 1, Barred: 2, Available: 3}, Grant},
		{"not before the backoff", fruitless, time.Second, Situation{MinGroup: 1, Barred: 1, Available: 1}, Wait},
		{"no new pass that could not make the minimum group", fruitless, time.Hour, Situation{MinGroup: 3, Barred: 1, Available: 1}, Wait},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want.String(), tc.book().Next(t0.Add(tc.at), tc.s).String())
		})
	}
}

// TestBookPassBackoffDoubles: every new pass (everyone failed, nothing received) waits
// twice as long as the one before, up to the cap.
func TestBookPassBackoffDoubles(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := NewBook(1, t0)
	b.MaxBackoff = 20 * time.Second
	s := Situation{MinGroup: 1, Barred: 1, Available: 1}
	now := t0
	var waits []time.Duration
	for range 5 {
		b.Grant(bookLeases(1, "x"))
		b.Bar("x", "released")
		b.End(now)
		d := time.Duration(0)
		for b.Next(now.Add(d), s) != NewPass {
			d += 100 * time.Millisecond
		}
		waits = append(waits, d)
		now = now.Add(d)
		b.StartPass()
	}
	require.Equal(t, []time.Duration{3 * time.Second, 6 * time.Second, 12 * time.Second, 20 * time.Second, 20 * time.Second}, waits)
	// Screening rejected everything received: the same wait before the next pass.
	b.Grant(bookLeases(1, "x"))
	b.Report("x")
	b.End(now)
	require.Equal(t, Close, b.Next(now, Situation{Received: 1, MinGroup: 1}))
	b.Bar("x", "norm_outlier")
	b.Discard(now)
	require.Equal(t, Wait, b.Next(now.Add(19*time.Second), s))
	require.Equal(t, NewPass, b.Next(now.Add(20*time.Second), s))
}

// TestBookNewPassReadmits: when everyone failed and nothing was received, a new pass gives
// the barred another chance, and the backoff keeps growing.
func TestBookNewPassReadmits(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := NewBook(1, t0)
	b.Grant(bookLeases(1, "a", "b"))
	b.Bar("a", "norm_outlier")
	b.Bar("b", "low_cosine")
	b.End(t0)
	live := trainers("a", "b")
	require.Empty(t, b.Candidates(live))
	s := Situation{MinGroup: 2, Barred: 2, Available: 2}
	require.Equal(t, NewPass, b.Next(t0.Add(DefaultBackoff), s))
	b.StartPass()
	require.Equal(t, 1, b.Passes())
	require.Equal(t, []string{"a", "b"}, peersOf(b.Candidates(live)))
	require.Equal(t, Grant, b.Next(t0.Add(DefaultBackoff), Situation{MinGroup: 2, Candidates: 2, Available: 2}))
	b.Grant(bookLeases(1, "a", "b"))
	b.Bar("a", "norm_outlier")
	b.Bar("b", "norm_outlier")
	b.End(t0.Add(DefaultBackoff))
	require.Equal(t, Wait, b.Next(t0.Add(2*DefaultBackoff), s), "the second pass waits longer")
	require.Equal(t, NewPass, b.Next(t0.Add(DefaultBackoff+4*DefaultBackoff), s))
}

// TestBookDisagreedLeasesOneAtATime: after a pair is discarded for disagreeing, the round
// stays lone through its new passes, and a lone trainer's report closes it whatever the
// minimum group.
func TestBookDisagreedLeasesOneAtATime(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := NewBook(1, t0)
	require.False(t, b.Lone())
	b.Grant(bookLeases(1, "a", "b"))
	b.Report("a")
	b.Report("b")
	b.End(t0)
	b.Bar("a", "low_cosine")
	b.Bar("b", "low_cosine")
	b.Discard(t0)
	b.Disagreed()
	require.True(t, b.Lone())
	s := Situation{MinGroup: 2, Barred: 2, Available: 2}
	require.Equal(t, NewPass, b.Next(t0.Add(DefaultBackoff), s))
	b.StartPass()
	require.True(t, b.Lone(), "a new pass keeps the round lone")
	b.Grant(bookLeases(1, OneOf(b.Candidates(trainers("a", "b")))[0].Peer))
	b.Report("a")
	b.End(t0.Add(DefaultBackoff))
	require.Equal(t, Close, b.Next(t0.Add(DefaultBackoff), Situation{Received: 1, MinGroup: 2, Candidates: 1, Available: 1}))
	require.False(t, NewBook(2, t0).Lone(), "the next round starts with pairs again")
}

// TestBookRoundsEnd simulates a leader over random fleets: honest trainers report, bad ones
// are rejected, release or let their lease expire, flaky ones are rejected half the time.
// Every round closes whenever at least one honest or flaky trainer is live, and no peer is
// leased twice in one pass.
func TestBookRoundsEnd(t *testing.T) {
	for seed := range 200 {
		rng := rand.New(rand.NewPCG(uint64(seed), 12))
		n := 1 + rng.IntN(8)
		behaviour := map[string]int{} // 0 honest, 1 rejected, 2 released, 3 expired, 4 rejected half the time
		var live []Trainer
		honest := 0
		for i := range n {
			p := fmt.Sprintf("t%d", i)
			behaviour[p] = rng.IntN(5)
			if behaviour[p] == 0 || behaviour[p] == 4 {
				honest++
			}
			live = append(live, Trainer{Peer: p, Capacity: 1})
		}
		minGroup := 1 + rng.IntN(4)
		shards := 1 + rng.IntN(10)
		now := time.Unix(1000, 0)
		b := NewBook(1, now)
		received, leasedInPass := 0, map[string]int{}
		closed := false
		for step := 0; step < 10000 && !closed; step++ {
			cands := b.Candidates(live)
			barred := len(b.Barred())
			s := Situation{Received: received, MinGroup: minGroup, Candidates: len(cands), Barred: barred,
				Available: shards - received, Patience: 5 * time.Second}
			switch b.Next(now, s) {
			case Close:
				closed = true
			case NewPass:
				require.Zero(t, received, "seed %d: a new pass with contributions in hand", seed)
				b.StartPass()
				clear(leasedInPass)
			case Grant:
				// One microshard each, as far as they go.
				if len(cands) > shards-received {
					cands = cands[:shards-received]
				}
				var ls []Lease
				for _, c := range cands {
					leasedInPass[c.Peer]++
					require.Equal(t, 1, leasedInPass[c.Peer], "seed %d: %s leased twice in a pass", seed, c.Peer)
					ls = append(ls, Lease{Round: 1, Trainer: c.Peer, Microshards: []uint32{0}})
				}
				b.Grant(ls)
				for _, c := range cands {
					switch behaviour[c.Peer] {
					case 0:
						b.Report(c.Peer)
						received++
					case 1:
						b.Bar(c.Peer, "norm_outlier")
					case 2:
						b.Bar(c.Peer, "released")
					case 4:
						if rng.IntN(2) == 0 {
							b.Report(c.Peer)
							received++
						} else {
							b.Bar(c.Peer, "low_cosine")
						}
					}
				}
				b.Expire()
				now = now.Add(time.Second)
				b.End(now)
			default:
				now = now.Add(250 * time.Millisecond)
			}
		}
		if honest > 0 && n >= minGroup {
			require.True(t, closed, "seed %d: %d trainers (%d honest), min_group %d, %d shards: the round never closed", seed, n, honest, minGroup, shards)
		}
		if closed {
			require.Positive(t, received, "seed %d: closed with nothing", seed)
		}
	}
}

// TestBookReadmitsOnlyTrainersThatCameBack: a trainer that left (restarted, or fell
// silent) while leased is readmitted once it is heard from again — if it failed the round
// only by leaving or by an expired lease, and at most Returns times a round. A rejected or
// released lease is never forgiven, however often its trainer reconnects: the issue-12
// livelock (a rejected attacker re-leased at every attempt) stays closed.
func TestBookReadmitsOnlyTrainersThatCameBack(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		name string
		// do runs on a book where "x" and "h" hold leases of the round's first attempt.
		do       func(b *Book) []bool // the results of the Back calls
		backs    []bool
		settled  bool // the attempt's leases are all settled afterwards ("h" reports first)
		canLease []string
		barred   map[string]string
	}{
		{"restarted while holding its lease: settled at once, then readmitted",
			func(b *Book) []bool { require.True(t, b.Gone("x")); return []bool{b.Back("x")} },
			[]bool{true}, true, []string{"x"}, map[string]string{}},
		{"not back yet: stays barred, its lease settled",
			func(b *Book) []bool { b.Gone("x"); return nil },
			nil, true, nil, map[string]string{"x": ReasonGone}},
		{"expired, then restarted: readmitted",
			func(b *Book) []bool { b.Expire(); b.Gone("x"); return []bool{b.Back("x")} },
			[]bool{true}, true, []string{"x"}, map[string]string{}},
		{"expired but never left: no second attempt",
			func(b *Book) []bool { b.Expire(); return []bool{b.Back("x")} },
			[]bool{false}, true, nil, map[string]string{"x": ReasonExpired}},
		{"rejected, then restarted: stays out",
			func(b *Book) []bool { b.Bar("x", "no_lease"); b.Gone("x"); return []bool{b.Back("x")} },
			[]bool{false}, true, nil, map[string]string{"x": "no_lease"}},
		{"released, then restarted: stays out",
			func(b *Book) []bool { b.Bar("x", "released"); b.Gone("x"); return []bool{b.Back("x")} },
			[]bool{false}, true, nil, map[string]string{"x": "released"}},
		{"rejected at screening after it reported, then restarted: stays out",
			func(b *Book) []bool {
				b.Report("x")
				b.Bar("x", "norm_outlier")
				b.Gone("x")
				return []bool{b.Back("x")}
			},
			[]bool{false}, true, nil, map[string]string{"x": "norm_outlier"}},
		{"reported, then restarted: nothing to readmit",
			func(b *Book) []bool { b.Report("x"); require.False(t, b.Gone("x")); return []bool{b.Back("x")} },
			[]bool{false}, true, nil, map[string]string{}},
		{"once a round: gone, back, leased again, gone again, back again",
			func(b *Book) []bool {
				b.Gone("x")
				first := b.Back("x")
				b.Grant(bookLeases(1, "x"))
				require.True(t, b.Gone("x"))
				return []bool{first, b.Back("x")}
			},
			[]bool{true, false}, true, nil, map[string]string{"x": ReasonGone}},
		{"back without having left: nothing",
			func(b *Book) []bool { return []bool{b.Back("x")} },
			[]bool{false}, false, nil, map[string]string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBook(1, t0)
			b.Grant(bookLeases(1, "x", "h"))
			b.Report("h")
			require.Equal(t, tc.backs, tc.do(b))
			require.Equal(t, tc.settled, b.Settled())
			require.Equal(t, tc.barred, b.Barred())
			require.Equal(t, tc.canLease, peersOf(b.Candidates(trainers("x", "h"))))
		})
	}
	// Strangers (never leased in the round) are not recorded: a flood of fresh ids does not
	// grow the book, and there is nothing to readmit.
	b := NewBook(1, t0)
	require.False(t, b.Gone("stranger"))
	require.False(t, b.Back("stranger"))
}

// TestBookRestartsCannotSpin: a trainer that restarts at every lease it gets (or lets each
// expire and reconnects) is granted at most 1 + Returns attempts in a pass, however many
// times it comes back; the round then goes on without it.
func TestBookRestartsCannotSpin(t *testing.T) {
	for _, leave := range []string{"restart", "expire and reconnect"} {
		t.Run(leave, func(t *testing.T) {
			t0 := time.Unix(1000, 0)
			b := NewBook(1, t0)
			granted := 0
			for i := range 100 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				s := Situation{Received: 1, MinGroup: 2, Candidates: len(b.Candidates(trainers("x"))), Available: 5, Patience: time.Hour}
				if b.Next(now, s) != Grant {
					continue
				}
				b.Grant(bookLeases(1, "x"))
				granted++
				if leave == "restart" {
					b.Gone("x")
				} else {
					b.Expire()
					b.Gone("x")
				}
				b.End(now)
				b.Back("x")
			}
			require.Equal(t, 1+DefaultReturns, granted)
		})
	}
}

// TestExpireExceptKeepsArrivingLeases: at the deadline a holder whose update is still
// arriving keeps its lease; the others expire; it settles when the update is in.
func TestExpireExceptKeepsArrivingLeases(t *testing.T) {
	b := NewBook(7, time.Unix(1000, 0))
	ls := bookLeases(7, "a", "b", "c")
	b.Grant(ls)
	b.Report("a")
	require.Equal(t, []string{"c"}, b.ExpireExcept(func(p string) bool { return p == "b" }))
	require.False(t, b.Settled())
	require.True(t, b.Holds("b", ls[1].ID()))
	require.Equal(t, map[string]string{"c": ReasonExpired}, b.Barred())
	b.Report("b")
	require.True(t, b.Settled())
}

// TestBookReholdsALeaseItsTrainersSilenceSettled: a trainer that fell silent (Gone) while
// holding its lease, and whose contribution on that lease arrives while the attempt is
// still open, holds the lease again, whether or not it was heard from (Back) first; it
// may then report. Refused after the attempt ended, for another lease, after any other
// bar, and past Returns.
func TestBookReholdsALeaseItsTrainersSilenceSettled(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		name string
		// do runs on a book where "x" and "h" hold leases of the round's first attempt
		// (first), and "h" reported; it returns what Rehold said.
		do     func(b *Book, first []Lease) bool
		want   bool
		barred map[string]string
	}{
		{"silent, then its contribution", func(b *Book, first []Lease) bool {
			b.Gone("x")
			return b.Rehold("x", first[0].ID())
		}, true, map[string]string{}},
		{"silent, heard again, then its contribution", func(b *Book, first []Lease) bool {
			b.Gone("x")
			require.True(t, b.Back("x"))
			return b.Rehold("x", first[0].ID())
		}, true, map[string]string{}},
		{"another lease", func(b *Book, first []Lease) bool {
			b.Gone("x")
			return b.Rehold("x", first[1].ID())
		}, false, map[string]string{"x": ReasonGone}},
		{"the attempt ended", func(b *Book, first []Lease) bool {
			b.Gone("x")
			b.End(t0)
			return b.Rehold("x", first[0].ID())
		}, false, map[string]string{"x": ReasonGone}},
		{"a later attempt", func(b *Book, first []Lease) bool {
			b.Gone("x")
			b.End(t0)
			b.Back("x")
			b.Grant(bookLeases(1, "h"))
			return b.Rehold("x", first[0].ID())
		}, false, map[string]string{}},
		{"expired, not silent", func(b *Book, first []Lease) bool {
			b.Expire()
			return b.Rehold("x", first[0].ID())
		}, false, map[string]string{"x": ReasonExpired}},
		{"released, then silent", func(b *Book, first []Lease) bool {
			b.Bar("x", "released")
			b.Gone("x")
			return b.Rehold("x", first[0].ID())
		}, false, map[string]string{"x": "released"}},
		{"its one return used", func(b *Book, first []Lease) bool {
			b.Returns = 0
			b.Gone("x")
			return b.Rehold("x", first[0].ID())
		}, false, map[string]string{"x": ReasonGone}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBook(1, t0)
			first := bookLeases(1, "x", "h")
			b.Grant(first)
			b.Report("h")
			require.Equal(t, tc.want, tc.do(b, first))
			require.Equal(t, tc.barred, b.Barred())
			if tc.want {
				require.True(t, b.Holds("x", first[0].ID()))
				require.False(t, b.Settled())
				b.Report("x")
				require.True(t, b.Settled())
				b.End(t0)
				require.Equal(t, Close, b.Next(t0, Situation{Received: 2, MinGroup: 2, Available: 2, Patience: time.Hour}),
					"an attempt whose leases were all reported, one of them held again, is clean")
			}
		})
	}
}
