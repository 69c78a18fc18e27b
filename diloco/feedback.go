package diloco

import "fmt"

// DefaultFeedbackDecay is how much of the sparse codec's error-feedback residual carries
// into the next round (protocol.sparse_feedback_decay), SparseLoCo's 0.95: stale
// remainders fade instead of piling up (docs/design-notes.md).
const DefaultFeedbackDecay = 0.95

// feedbackDecay checks an error-feedback decay (protocol.sparse_feedback_decay) and returns
// it as the float32 the encoder multiplies the residual by: what a trainer has not sent for
// several rounds counts less, round by round, than what it trained since. It must be in
// (0, 1] and not round to 0.
func feedbackDecay(decay float64) (float32, error) {
	if !(decay > 0 && decay <= 1) {
		return 0, fmt.Errorf("error feedback: %w: decay %v not in (0, 1]", ErrBadConfig, decay)
	}
	b := float32(decay)
	if b == 0 {
		return 0, fmt.Errorf("error feedback: %w: decay %v rounds to 0 in float32", ErrBadConfig, decay)
	}
	return b, nil
}
