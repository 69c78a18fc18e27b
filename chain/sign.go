package chain

import (
	"errors"
	"fmt"
	"slices"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/detcbor"
)

// ErrBadSignature is returned for a signature that does not verify or a signer that is not
// an allowed validator.
var ErrBadSignature = errors.New("bad head signature")

// signDomain separates head signatures from anything else the same key signs.
const signDomain = "p2ptrain/head-attestation/v1\x00"

// Signature is one validator's attestation of a head CID.
type Signature struct {
	Peer string `cbor:"1,keyasint"`
	Sig  []byte `cbor:"2,keyasint"`
}

// SignedHead is a head with the validator signatures collected for it.
type SignedHead struct {
	Head []byte      `cbor:"1,keyasint"` // canonical head encoding
	Sigs []Signature `cbor:"2,keyasint"`
}

func signBytes(id cid.Cid) []byte { return append([]byte(signDomain), id.Bytes()...) }

// Sign returns key's attestation of the head id.
func Sign(key crypto.PrivKey, id cid.Cid) (Signature, error) {
	p, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return Signature{}, fmt.Errorf("sign head %s: %w", id, err)
	}
	sig, err := key.Sign(signBytes(id))
	if err != nil {
		return Signature{}, fmt.Errorf("sign head %s: %w", id, err)
	}
	return Signature{Peer: p.String(), Sig: sig}, nil
}

// VerifySignature checks one attestation of id.
func VerifySignature(id cid.Cid, s Signature) error {
	p, err := peer.Decode(s.Peer)
	if err != nil {
		return fmt.Errorf("%w: signer %q: %v", ErrBadSignature, s.Peer, err)
	}
	pub, err := p.ExtractPublicKey()
	if err != nil {
		return fmt.Errorf("%w: signer %s: no public key in peer id: %v", ErrBadSignature, p, err)
	}
	ok, err := pub.Verify(signBytes(id), s.Sig)
	if err != nil || !ok {
		return fmt.Errorf("%w: signer %s on head %s", ErrBadSignature, p, id)
	}
	return nil
}

// Add merges an attestation into the set (sorted by peer, one per peer).
func (s *SignedHead) Add(sig Signature) bool {
	i, found := slices.BinarySearchFunc(s.Sigs, sig.Peer, func(a Signature, p string) int {
		switch {
		case a.Peer < p:
			return -1
		case a.Peer > p:
			return 1
		}
		return 0
	})
	if found {
		return false
	}
	s.Sigs = slices.Insert(s.Sigs, i, sig)
	return true
}

// FindSignature returns peer's signature among sigs, or nil.
func FindSignature(sigs []Signature, peer string) *Signature {
	if i := slices.IndexFunc(sigs, func(s Signature) bool { return s.Peer == peer }); i >= 0 {
		return &sigs[i]
	}
	return nil
}

// ID is the CID of the head inside.
func (s *SignedHead) ID() cid.Cid { return recordCID(s.Head) }

// Decode returns the head inside.
func (s *SignedHead) Decode() (*Head, error) { return DecodeHead(s.Head) }

// Quorum counts valid signatures from allowed validators (each counted once) and returns an
// error when fewer than quorum verify. allowed empty means any signer counts.
func (s *SignedHead) Quorum(allowed []string, quorum int) (int, error) {
	id := s.ID()
	n := 0
	seen := map[string]bool{}
	for _, sig := range s.Sigs {
		if seen[sig.Peer] || (len(allowed) > 0 && !slices.Contains(allowed, sig.Peer)) {
			continue
		}
		if VerifySignature(id, sig) != nil {
			continue
		}
		seen[sig.Peer] = true
		n++
	}
	if n < quorum {
		return n, fmt.Errorf("%w: head %s has %d valid validator signatures, quorum is %d", ErrBadSignature, id, n, quorum)
	}
	return n, nil
}

// EncodeSigned encodes a signed head.
func EncodeSigned(s *SignedHead) ([]byte, error) { return detcbor.Marshal(s) }

// DecodeSigned decodes a signed head and its head.
func DecodeSigned(b []byte) (*SignedHead, *Head, error) {
	if len(b) > MaxHeadBytes+64<<10 {
		return nil, nil, fmt.Errorf("%w: signed head of %d bytes", ErrMalformed, len(b))
	}
	var s SignedHead
	if err := decMode.Unmarshal(b, &s); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if len(s.Sigs) > 256 {
		return nil, nil, fmt.Errorf("%w: %d signatures", ErrMalformed, len(s.Sigs))
	}
	h, err := DecodeHead(s.Head)
	if err != nil {
		return nil, nil, err
	}
	return &s, h, nil
}
