package merge

import "errors"

// Sentinel errors. Every error returned by this package wraps one of them, so callers can
// tell a caller bug (bad lengths, bad options) from a bad contribution with errors.Is.
var (
	// ErrEmpty: there is nothing to combine (no inputs, or an empty cohort).
	ErrEmpty = errors.New("merge: no inputs")
	// ErrLengthMismatch: vectors that must have the same length do not.
	ErrLengthMismatch = errors.New("merge: length mismatch")
	// ErrBadWeight: a weight is ≤ 0, NaN or infinite, or the weights sum to infinity.
	ErrBadWeight = errors.New("merge: bad weight")
	// ErrBadOption: an option (EMA weight, trim fraction, norm bound, threshold) is out of range.
	ErrBadOption = errors.New("merge: bad option")
	// ErrNonFinite: an input holds NaN or ±Inf where the operation needs finite values.
	ErrNonFinite = errors.New("merge: non-finite value")
	// ErrAliased: dst is the same memory as one of the inputs it is computed from.
	ErrAliased = errors.New("merge: dst aliases an input")
	// ErrUnknownAggregator: the aggregator name is not one of the Aggregator constants.
	ErrUnknownAggregator = errors.New("merge: unknown aggregator")
)
