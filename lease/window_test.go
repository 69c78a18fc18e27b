package lease

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWindowShare(t *testing.T) {
	// The digits demo's plan: 23 microshards holding 1438 examples (62.5 each).
	digits := WindowSize{PerTrainer: 3, InnerSteps: 20, SamplesPerStep: 32, Shards: 23, Examples: 1438, Trainers: 1}
	with := func(f func(*WindowSize)) WindowSize {
		s := digits
		f(&s)
		return s
	}
	cases := []struct {
		name string
		in   WindowSize
		want Window
	}{
		// 640 samples need ceil(640 × 23 / 1438) = 11 microshards.
		{"one trainer: raised to the window", digits, Window{Share: 11, Need: 11}},
		{"two trainers fit the epoch", with(func(s *WindowSize) { s.Trainers = 2 }), Window{Share: 11, Need: 11}},
		// 3 × 11 = 33 > 23: the data does not allow it, so the share is left as configured.
		{"three trainers do not fit: share as configured", with(func(s *WindowSize) { s.Trainers = 3 }), Window{Share: 3, Need: 11}},
		{"the demo's batch 16 fits three trainers", with(func(s *WindowSize) { s.Trainers = 3; s.SamplesPerStep = 16; s.PerTrainer = 6 }),
			Window{Share: 6, Need: 6}},
		{"configured share above the need stays", with(func(s *WindowSize) { s.PerTrainer = 15 }), Window{Share: 15, Need: 11}},
		{"exact fit rounds no further", WindowSize{PerTrainer: 1, InnerSteps: 10, SamplesPerStep: 64, Shards: 100, Examples: 6400, Trainers: 10},
			Window{Share: 10, Need: 10}},
		{"one example over rounds up", WindowSize{PerTrainer: 1, InnerSteps: 10, SamplesPerStep: 64, Shards: 100, Examples: 6399, Trainers: 9},
			Window{Share: 11, Need: 11}},
		{"zero trainers count as one", with(func(s *WindowSize) { s.Trainers = 0 }), Window{Share: 11, Need: 11}},
		{"need above one lease's bound", WindowSize{PerTrainer: 4, InnerSteps: 5000, SamplesPerStep: 1000, Shards: 100000, Examples: 1e6, Trainers: 1},
			Window{Share: 4, Need: 500000}},
		{"product beyond 64 bits", WindowSize{PerTrainer: 4, InnerSteps: math.MaxInt, SamplesPerStep: math.MaxInt, Shards: math.MaxInt, Examples: 1, Trainers: 1},
			Window{Share: 4, Need: math.MaxInt32}},
		{"batch size unknown", with(func(s *WindowSize) { s.SamplesPerStep = 0 }), Window{Share: 3}},
		{"inner steps unknown", with(func(s *WindowSize) { s.InnerSteps = 0 }), Window{Share: 3}},
		{"example counts unknown", with(func(s *WindowSize) { s.Examples = 0 }), Window{Share: 3}},
		{"empty plan", with(func(s *WindowSize) { s.Shards = 0 }), Window{Share: 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := WindowShare(tc.in)
			require.Equal(t, tc.want, got)
			// The rule: a share either holds a window or says that it repeats.
			require.Equal(t, got.Need > got.Share, got.Repeats())
		})
	}
}

// TestWindowShareTail: at an epoch's tail the share that WindowShare raised is what
// WindowSteps measures a short lease against, so a trainer leased part of a window runs that
// part of inner_steps, and no window reads an example twice.
func TestWindowShareTail(t *testing.T) {
	trainers := []Trainer{{Peer: "a"}, {Peer: "b"}, {Peer: "c"}}
	w := WindowShare(WindowSize{PerTrainer: 2, InnerSteps: 20, SamplesPerStep: 16, Shards: 23, Examples: 1438, Trainers: len(trainers)})
	require.Equal(t, 6, w.Share)
	cases := []struct {
		name  string
		avail int
		want  map[string]int // microshards leased → steps
	}{
		{"a full round", 23, map[string]int{"a": 20, "b": 20, "c": 20}},
		{"the epoch's tail: 5 left", 5, map[string]int{"a": 7, "b": 7, "c": 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			avail := make([]uint32, tc.avail)
			for i := range avail {
				avail[i] = uint32(i)
			}
			plan := AssignWithin(avail, trainers, w.Share, MaxRoundMicroshards, []byte("s"))
			steps := WindowSteps(Steps(trainers, 20), plan, trainers, w.Share)
			got := map[string]int{}
			for p := range plan {
				got[p] = steps[p]
				// Samples read ≤ examples leased (62.5 per microshard here).
				require.LessOrEqual(t, float64(steps[p]*16), 62.5*float64(len(plan[p])), "trainer %s", p)
			}
			require.Equal(t, tc.want, got)
		})
	}
}
