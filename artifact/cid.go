package artifact

import (
	"errors"
	"fmt"

	"github.com/ipfs/go-cid"
	mh "github.com/multiformats/go-multihash"
)

// ErrBadCID is returned for a CID we will not fetch or trust (wrong version, codec or hash).
var ErrBadCID = errors.New("unacceptable CID")

// CodecCBOR is the multicodec "cbor" (0x51): our records are deterministic CBOR but not
// DAG-CBOR (CIDs inside them are plain byte strings), so we do not claim 0x71.
const CodecCBOR = 0x51

var (
	rawBuilder  = cid.V1Builder{Codec: cid.Raw, MhType: mh.SHA2_256}
	cborBuilder = cid.V1Builder{Codec: CodecCBOR, MhType: mh.SHA2_256}
)

// RawCID is the CID of a chunk (or any raw bytes).
func RawCID(b []byte) cid.Cid {
	c, err := rawBuilder.Sum(b)
	if err != nil { // sha2-256 of a byte slice cannot fail
		panic(fmt.Sprintf("sum raw cid: %v", err))
	}
	return c
}

// RecordCID is the CID of a deterministic CBOR record (manifests, heads, leases).
func RecordCID(b []byte) cid.Cid {
	c, err := cborBuilder.Sum(b)
	if err != nil {
		panic(fmt.Sprintf("sum cbor cid: %v", err))
	}
	return c
}

// CheckCID accepts only CIDv1 with a sha2-256 multihash of the expected codec.
func CheckCID(c cid.Cid, codec uint64) error {
	if !c.Defined() {
		return fmt.Errorf("%w: undefined", ErrBadCID)
	}
	p := c.Prefix()
	if p.Version != 1 || p.MhType != mh.SHA2_256 || p.MhLength != 32 {
		return fmt.Errorf("%w: %s: want CIDv1 sha2-256", ErrBadCID, c)
	}
	if p.Codec != codec {
		return fmt.Errorf("%w: %s: codec 0x%x, want 0x%x", ErrBadCID, c, p.Codec, codec)
	}
	return nil
}

// VerifyRaw recomputes b's CID and compares it with want.
func VerifyRaw(want cid.Cid, b []byte) error {
	if got := RawCID(b); !got.Equals(want) {
		return fmt.Errorf("%w: bytes hash to %s, expected %s", ErrCorrupt, got, want)
	}
	return nil
}

// Parse parses a CID string and checks it names an artifact (a CBOR manifest).
func Parse(s string) (cid.Cid, error) {
	c, err := cid.Decode(s)
	if err != nil {
		return cid.Undef, fmt.Errorf("parse artifact id %q: %w", s, err)
	}
	if err := CheckCID(c, CodecCBOR); err != nil {
		return cid.Undef, err
	}
	return c, nil
}
