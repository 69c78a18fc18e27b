package node

import (
	"testing"

	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/trainer"
	"github.com/p2pnode/p2pnode/validator"
)

func TestTrainerSeed(t *testing.T) {
	const a, b = "12D3KooWKRkDv7Qtc3XarfLsiD2Cr8Hfx2Ly5DgCaR7HQMht5Epi", "12D3KooWPaqULUqUVGshkeK5W8ugAS3tFAjrtnhkBxCsDVevXxVH"
	base := trainer.Seed(1, 5, 0, a)
	if trainer.Seed(1, 5, 0, a) != base {
		t.Fatal("the same trainer, round and attempt gave two seeds")
	}
	if base < 0 {
		t.Fatalf("seed %d is negative", base)
	}
	others := map[string]int64{
		"another trainer":    trainer.Seed(1, 5, 0, b),
		"another round":      trainer.Seed(1, 6, 0, a),
		"another attempt":    trainer.Seed(1, 5, 1, a),
		"another experiment": trainer.Seed(2, 5, 0, a),
	}
	for what, s := range others {
		if s == base {
			t.Errorf("%s gave the same seed %d", what, s)
		}
	}
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
		work := validator.WorkCandidates(cands, tc.proportional)
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
		t.Fatal("validator.WorkCandidates changed its input")
	}
}
