package lease

import (
	"math"
	"testing"
)

func TestWindowShare(t *testing.T) {
	cases := []struct {
		name                               string
		perTrainer, steps, perStep, shards int
		examples                           int64
		want                               int
	}{
		// The digits demo: 23 microshards of 64 examples (the last 30), H 20 × batch 32.
		{"digits demo: 640 samples need 11 of 62.5", 3, 20, 32, 23, 1438, 11},
		{"exact fit needs no extra microshard", 3, 20, 32, 10, 640, 10},
		{"one sample more rounds up", 3, 20, 32, 10, 639, 11},
		{"configured share already covers the window", 12, 20, 32, 23, 1438, 12},
		{"large microshards: one is enough", 2, 20, 32, 100, 102400, 2},
		{"batch size unknown", 3, 20, 0, 23, 1438, 3},
		{"example counts unknown", 3, 20, 32, 23, 0, 3},
		{"no plan", 3, 20, 32, 0, 0, 3},
		{"capped at one lease's bound", 1, 1000, 1000, 1 << 20, 1 << 20, MaxLeaseMicroshards},
		{"huge factors do not overflow", 1, math.MaxInt, math.MaxInt, math.MaxInt, 1, MaxLeaseMicroshards},
		{"configured share above the cap stays", MaxLeaseMicroshards + 1, 20, 32, 23, 1438, MaxLeaseMicroshards + 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := WindowShare(tc.perTrainer, tc.steps, tc.perStep, tc.shards, tc.examples); got != tc.want {
				t.Errorf("WindowShare(%d, %d, %d, %d, %d) = %d, want %d", tc.perTrainer, tc.steps, tc.perStep, tc.shards, tc.examples, got, tc.want)
			}
		})
	}
}

func TestStepSamples(t *testing.T) {
	cases := []struct {
		name string
		ws   []Window
		want int
	}{
		{"none", nil, 0},
		{"full batches", []Window{{640, 20}, {640, 20}, {640, 20}}, 32},
		{"a partial last batch still reads as the batch", []Window{{606, 20}}, 31},
		{"tail windows of fewer steps agree", []Window{{640, 20}, {448, 14}, {512, 16}}, 32},
		{"one overstated window does not move the median", []Window{{640, 20}, {640, 20}, {1 << 40, 20}}, 32},
		{"even count takes the lower middle", []Window{{320, 20}, {640, 20}}, 16},
		{"windows without steps are ignored", []Window{{640, 0}, {640, 20}}, 32},
		{"only windows without steps", []Window{{640, 0}}, 0},
		{"capped to an int32", []Window{{math.MaxUint64, 1}}, math.MaxInt32},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := StepSamples(tc.ws); got != tc.want {
				t.Errorf("StepSamples(%v) = %d, want %d", tc.ws, got, tc.want)
			}
		})
	}
}

// TestWindowShareAtTheEpochTail: the share feeds Assign and TailSteps, so a window reads
// each leased example once whether the epoch has enough microshards left or not.
func TestWindowShareAtTheEpochTail(t *testing.T) {
	even := []Trainer{{Peer: "a"}, {Peer: "b"}, {Peer: "c"}}
	const steps, batch, perShard = 20, 32, 64
	share := WindowShare(3, steps, batch, 100, 100*perShard) // 640 / 64 = 10
	if share != 10 {
		t.Fatalf("share %d, want 10", share)
	}
	cases := []struct {
		name  string
		avail int
		want  map[string][2]int // microshards, steps
	}{
		{"a whole window each", 40, map[string][2]int{"a": {10, 20}, "b": {10, 20}, "c": {10, 20}}},
		{"tail: 23 left", 23, map[string][2]int{"a": {8, 16}, "b": {8, 16}, "c": {7, 14}}},
		{"tail: 4 left", 4, map[string][2]int{"a": {2, 4}, "b": {1, 2}, "c": {1, 2}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			avail := make([]uint32, tc.avail)
			for i := range avail {
				avail[i] = uint32(i)
			}
			plan := Assign(avail, even, share, []byte("s"))
			got := TailSteps(Steps(even, steps), plan, even, share)
			if len(plan) != len(tc.want) {
				t.Fatalf("plan %v, want leases for %v", plan, tc.want)
			}
			for p, w := range tc.want {
				if len(plan[p]) != w[0] || got[p] != w[1] {
					t.Errorf("%s: %d microshards and %d steps, want %d and %d", p, len(plan[p]), got[p], w[0], w[1])
				}
				if samples := got[p] * batch; samples > len(plan[p])*perShard {
					t.Errorf("%s: %d steps read %d samples of %d leased: the window repeats its data", p, got[p], samples, len(plan[p])*perShard)
				}
			}
		})
	}
}
