package node

import (
	"testing"

	"github.com/p2pnode/p2pnode/trainer"
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
