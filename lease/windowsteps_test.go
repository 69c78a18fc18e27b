package lease

import "testing"

func TestWindowSteps(t *testing.T) {
	even := []Trainer{{Peer: "a"}, {Peer: "b"}, {Peer: "c"}}
	cases := []struct {
		name     string
		trainers []Trainer
		avail    int
		want     map[string]int
	}{
		{"full windows", even, 9, map[string]int{"a": 20, "b": 20, "c": 20}},
		{"epoch tail: 4 of 9", even, 4, map[string]int{"a": 13, "b": 7, "c": 7}},
		{"epoch tail: 1", even, 1, map[string]int{"a": 7}},
		{"mixed speeds, enough data", []Trainer{{Peer: "a", Capacity: 1}, {Peer: "b", Capacity: 2}}, 20,
			map[string]int{"a": 13, "b": 27}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			avail := make([]uint32, tc.avail)
			for i := range avail {
				avail[i] = uint32(i)
			}
			plan := Assign(avail, tc.trainers, 3, []byte("s"))
			steps := WindowSteps(Steps(tc.trainers, 20), plan, tc.trainers, 3)
			if len(plan) != len(tc.want) {
				t.Fatalf("plan %v, want leases for %v", plan, tc.want)
			}
			for p := range plan {
				if want, ok := tc.want[p]; !ok || steps[p] != want {
					t.Errorf("%s: %d steps for %d microshards, want %d", p, steps[p], len(plan[p]), want)
				}
			}
		})
	}
}

// TestAbsorbTail: the epoch's last full round takes a leftover of up to half a round with
// it — every microshard leased, windows longer in proportion — and otherwise the share
// stays; a later attempt that re-leases a failed trainer's microshards follows the same rule.
func TestAbsorbTail(t *testing.T) {
	two := []Trainer{{Peer: "a"}, {Peer: "b"}}
	three := []Trainer{{Peer: "a"}, {Peer: "b"}, {Peer: "c"}}
	cases := []struct {
		name      string
		trainers  []Trainer
		avail     int
		share     int
		wantShare int
		wantSteps map[string]int // at 20 inner steps
	}{
		{"lm demo: 6 left, rounds of 4", two, 6, 2, 3, map[string]int{"a": 30, "b": 30}},
		{"a leftover of one", two, 5, 2, 3, map[string]int{"a": 30, "b": 20}},
		{"exactly a round: no change", two, 4, 2, 2, map[string]int{"a": 20, "b": 20}},
		{"a leftover of more than half a round stays a round of its own", two, 7, 2, 2, map[string]int{"a": 20, "b": 20}},
		{"mid-epoch: no change", two, 30, 2, 2, map[string]int{"a": 20, "b": 20}},
		{"the tail itself: no change", two, 2, 2, 2, map[string]int{"a": 10, "b": 10}},
		{"digits demo: 11 left of rounds of 12 is a tail round", three, 11, 4, 4, map[string]int{"a": 20, "b": 20, "c": 15}},
		{"three trainers, 5 left over rounds of 12", three, 17, 4, 6, map[string]int{"a": 30, "b": 30, "c": 25}},
		{"a failed trainer's 3 re-leased to one", []Trainer{{Peer: "c"}}, 3, 2, 3, map[string]int{"c": 30}},
		{"no trainers", nil, 6, 2, 2, map[string]int{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			share := AbsorbTail(tc.avail, tc.trainers, tc.share)
			if share != tc.wantShare {
				t.Fatalf("share %d, want %d", share, tc.wantShare)
			}
			avail := make([]uint32, tc.avail)
			for i := range avail {
				avail[i] = uint32(i)
			}
			plan := Assign(avail, tc.trainers, share, []byte("s"))
			leased := 0
			for _, ms := range plan {
				leased += len(ms)
			}
			if share != tc.share && leased != tc.avail {
				t.Errorf("absorbing round leased %d of %d microshards", leased, tc.avail)
			}
			steps := WindowSteps(Steps(tc.trainers, 20), plan, tc.trainers, tc.share)
			got := map[string]int{}
			for p := range plan {
				got[p] = steps[p]
			}
			if len(got) != len(tc.wantSteps) {
				t.Fatalf("steps %v, want %v (plan %v)", got, tc.wantSteps, plan)
			}
			for p, w := range tc.wantSteps {
				if got[p] != w {
					t.Errorf("%s: %d steps for %d microshards, want %d", p, got[p], len(plan[p]), w)
				}
			}
		})
	}
}
