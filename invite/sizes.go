package invite

import (
	"fmt"

	"github.com/fxamacker/cbor/v2"

	"github.com/p2pnode/p2pnode/detcbor"
)

// Sizes is what a joining node will download, as the serving validator sees it when asked:
// its canonical head's parameters and the experiment's dataset. It changes as the
// experiment goes on, so it is not part of the signed experiment; it comes over the
// stream from the dialed peer, which Verify checks is the record's signer. A joining node
// prints it and decides nothing on it.
type Sizes struct {
	// Round is the round of the head the parameter numbers are of.
	Round uint64 `cbor:"1,keyasint"`
	// Params is the head's parameter count (0: not known to the validator).
	Params int64 `cbor:"2,keyasint"`
	// ParamsBytes is the size of the head's parameter pack.
	ParamsBytes uint64 `cbor:"3,keyasint"`
	// DatasetBytes and DatasetFiles are the dataset's, from its manifest (0: not known).
	DatasetBytes uint64 `cbor:"4,keyasint"`
	DatasetFiles uint64 `cbor:"5,keyasint"`
}

// MaxSizesBytes bounds an encoded Sizes.
const MaxSizesBytes = 256

var sizesDecMode = func() cbor.DecMode {
	m, err := detcbor.DecMode(detcbor.Limits{MaxArrayElements: 16, MaxMapPairs: 16, MaxNestedLevels: 4})
	if err != nil {
		panic(err)
	}
	return m
}()

// EncodeSizes writes s in deterministic CBOR.
func EncodeSizes(s Sizes) ([]byte, error) { return detcbor.Marshal(s) }

// DecodeSizes reads an encoded Sizes strictly.
func DecodeSizes(b []byte) (*Sizes, error) {
	if len(b) > MaxSizesBytes {
		return nil, fmt.Errorf("sizes: %d bytes exceeds the %d-byte limit", len(b), MaxSizesBytes)
	}
	var s Sizes
	rest, err := sizesDecMode.UnmarshalFirst(b, &s)
	if err != nil {
		return nil, fmt.Errorf("sizes: %w", err)
	}
	if len(rest) > 0 {
		return nil, fmt.Errorf("sizes: %d bytes after them", len(rest))
	}
	if s.Params < 0 {
		return nil, fmt.Errorf("sizes: negative parameter count %d", s.Params)
	}
	return &s, nil
}
