package diloco

import (
	"fmt"

	"github.com/p2pnode/p2pnode/internal/parallel"
)

// DefaultFeedbackDecay is how much of the sparse codec's error-feedback residual carries
// into the next round (protocol.sparse_feedback_decay): 1, plain error feedback. SparseLoCo
// decays it (0.95); on the lm tiny workload 0.9 and 0.95 measured within the noise of 1
// (docs/wan.md), so the default keeps the behaviour the other measurements were made with.
const DefaultFeedbackDecay = 1.0

// DecayResidual scales residual by decay in place, before an encoding adds the new delta
// to it: what a trainer has not sent for several rounds counts less, round by round, than
// what it trained since (SparseLoCo's e ← β·e + Δ). decay 1 keeps it whole (plain error
// feedback). decay must be in (0, 1].
func DecayResidual(residual []float32, decay float64, workers int) error {
	if !(decay > 0 && decay <= 1) {
		return fmt.Errorf("error feedback: %w: decay %v not in (0, 1]", ErrBadConfig, decay)
	}
	if decay == 1 {
		return nil
	}
	b := float32(decay)
	if b == 0 {
		return fmt.Errorf("error feedback: %w: decay %v rounds to 0 in float32", ErrBadConfig, decay)
	}
	parallel.ForChunks(len(residual), parallel.ChunkLen, workers, func(_, lo, hi int) {
		r := residual[lo:hi]
		for i := range r {
			r[i] *= b
		}
	})
	return nil
}
