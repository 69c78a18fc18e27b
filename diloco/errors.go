package diloco

import (
	"errors"

	"github.com/p2pnode/p2pnode/codecs"
)

// Sentinel errors; every error returned by this package wraps one of them.
var (
	// ErrLengthMismatch: vectors that must have the same length do not.
	ErrLengthMismatch = errors.New("diloco: length mismatch")
	// ErrBadConfig: an optimizer or codec setting is out of range.
	ErrBadConfig = errors.New("diloco: bad config")
	// ErrUnknownCodec: the codec name is not one of the Codec constants (codecs.ErrUnknown).
	ErrUnknownCodec = codecs.ErrUnknown
	// ErrNonFinite: a vector to encode holds NaN or ±Inf.
	ErrNonFinite = errors.New("diloco: non-finite value")
	// ErrMalformed: an Encoded value is inconsistent (lengths, block size, scales). Decoded
	// data comes from peers, so this is the error to expect from a hostile contribution.
	ErrMalformed = errors.New("diloco: malformed encoding")
)
