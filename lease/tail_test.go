package lease

import "testing"

func TestTailSteps(t *testing.T) {
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
			steps := TailSteps(Steps(tc.trainers, 20), plan, tc.trainers, 3)
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
