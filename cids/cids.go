// Package cids owns the names of our content: the CID builders for records and raw bytes,
// the allow-list of CIDs we accept, and parsing artifact ids. Chunk CIDs, which only the
// transfer hashes, stay in artifact.
package cids

import (
	"errors"
	"fmt"

	"github.com/ipfs/go-cid"
	mh "github.com/multiformats/go-multihash"
)

// ErrBadCID is returned for a CID we will not fetch or trust (wrong version, codec or hash).
var ErrBadCID = errors.New("unacceptable CID")

// ErrCorrupt is returned when bytes do not match their CID (artifact.ErrCorrupt is the same
// error: the store's, the chain store's and the transfer's checks all wrap it).
var ErrCorrupt = errors.New("artifact corrupt")

// CodecCBOR is the multicodec "cbor" (0x51): our records are deterministic CBOR but not
// DAG-CBOR (CIDs inside them are plain byte strings), so we do not claim 0x71.
const CodecCBOR = 0x51

var (
	rawBuilder  = cid.V1Builder{Codec: cid.Raw, MhType: mh.SHA2_256}
	cborBuilder = cid.V1Builder{Codec: CodecCBOR, MhType: mh.SHA2_256}
)

// Raw is the sha2-256 CID of raw bytes that are not chunks (dataset manifests and plans
// name themselves with it).
func Raw(b []byte) cid.Cid {
	c, err := rawBuilder.Sum(b)
	if err != nil { // sha2-256 of a byte slice cannot fail
		panic(fmt.Sprintf("sum raw cid: %v", err))
	}
	return c
}

// Record is the CID of a deterministic CBOR record (manifests, heads, leases).
func Record(b []byte) cid.Cid {
	c, err := cborBuilder.Sum(b)
	if err != nil {
		panic(fmt.Sprintf("sum cbor cid: %v", err))
	}
	return c
}

// Check accepts only CIDv1 with a sha2-256 multihash of the expected codec.
func Check(c cid.Cid, codec uint64) error {
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

// Parse parses a CID string and checks it names an artifact (a CBOR manifest).
func Parse(s string) (cid.Cid, error) {
	c, err := cid.Decode(s)
	if err != nil {
		return cid.Undef, fmt.Errorf("parse artifact id %q: %w", s, err)
	}
	if err := Check(c, CodecCBOR); err != nil {
		return cid.Undef, err
	}
	return c, nil
}

// Short abbreviates a CID's string for logs and status lines: its first 8 and last 6
// characters.
func Short(s string) string {
	if len(s) <= 16 {
		return s
	}
	return s[:8] + "…" + s[len(s)-6:]
}
