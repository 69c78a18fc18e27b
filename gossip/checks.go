package gossip

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/chain"
)

// checker decides whether a message may travel: the rules behind every topic validator, and
// the pre-flight check of our own Publish. It is safe for concurrent use.
type checker struct {
	network    string
	experiment string
	maxSkew    time.Duration
	now        func() time.Time
	// validators is replaced whole on SetValidators, so validations never see a half-updated set.
	validators atomic.Pointer[map[peer.ID]struct{}]
}

func (c *checker) setValidators(ids []peer.ID) {
	set := make(map[peer.ID]struct{}, len(ids))
	for _, id := range ids {
		set[id] = struct{}{}
	}
	c.validators.Store(&set)
}

// isValidator reports whether p may publish heads, leases and attestations. An empty set
// allows nobody: a node without configured validators must not trust any head.
func (c *checker) isValidator(p peer.ID) bool {
	set := c.validators.Load()
	if set == nil {
		return false
	}
	_, ok := (*set)[p]
	return ok
}

// check decodes data once and applies the topic's rules. from is the message's author as
// StrictSign verified it. On success it returns the decoded message (what subscribers get).
func (c *checker) check(k Kind, from peer.ID, data []byte) (any, *outcome) {
	if limit := k.maxBytes(); len(data) > limit {
		return nil, rejectf(reasonTooLarge, "%s message of %d bytes exceeds %d", k, len(data), limit)
	}
	switch k {
	case KindPeers:
		return c.checkAnnounce(from, data)
	case KindLeases:
		return c.checkLeases(from, data)
	case KindContributions:
		return c.checkContribution(from, data)
	case KindHeads:
		return c.checkHead(from, data)
	case KindAttestations:
		return c.checkAttestation(from, data)
	case KindReleases:
		return c.checkRelease(from, data)
	}
	return nil, rejectf(reasonMalformed, "no rules for topic kind %q", k)
}

// The checks run cheapest first: membership before decoding, decoding before signatures,
// so a peer outside the validator set cannot make us decode or verify anything big.

func (c *checker) checkAnnounce(from peer.ID, data []byte) (any, *outcome) {
	m, err := DecodeAnnounce(data)
	if err != nil {
		return nil, reject(reasonMalformed, err)
	}
	if o := c.sameExperiment("announce", m.Experiment); o != nil {
		return nil, o
	}
	if m.Peer != from.String() {
		return nil, rejectf(reasonAuthorMismatch, "announce names peer %s", m.Peer)
	}
	// A node's clock may be off, and an announce may be replayed: outside the window it says
	// nothing current about the peer, but it is not proof of malice.
	if off := c.now().Sub(time.UnixMilli(m.Time)); off > c.maxSkew || off < -c.maxSkew {
		return nil, ignoref(reasonStale, "announce time is %s off our clock", off.Round(time.Second))
	}
	return m, nil
}

func (c *checker) checkLeases(from peer.ID, data []byte) (any, *outcome) {
	if !c.isValidator(from) {
		return nil, rejectf(reasonNotValidator, "leases from %s, not a validator", from)
	}
	m, err := DecodeLeases(data)
	if err != nil {
		return nil, reject(reasonMalformed, err)
	}
	if o := c.sameExperiment("leases", m.Experiment); o != nil {
		return nil, o
	}
	if m.Issuer != from.String() {
		return nil, rejectf(reasonAuthorMismatch, "leases for round %d name issuer %s", m.Round, m.Issuer)
	}
	// A grant whose deadline has passed can no longer be worked on; skew as for announces.
	if m.Deadline > 0 && c.now().After(time.UnixMilli(m.Deadline).Add(c.maxSkew)) {
		return nil, ignoref(reasonStale, "leases for round %d expired at %s", m.Round, time.UnixMilli(m.Deadline).UTC())
	}
	return m, nil
}

func (c *checker) checkContribution(from peer.ID, data []byte) (any, *outcome) {
	m, err := DecodeContribution(data)
	if err != nil {
		return nil, reject(reasonMalformed, err)
	}
	if o := c.sameExperiment("contribution", m.Experiment); o != nil {
		return nil, o
	}
	if m.Peer != from.String() {
		return nil, rejectf(reasonAuthorMismatch, "contribution for round %d names peer %s", m.Round, m.Peer)
	}
	return m, nil
}

// checkRelease admits a release only from the trainer it names: nobody can give back
// another trainer's lease. Whether that trainer holds the lease is the leader's check.
func (c *checker) checkRelease(from peer.ID, data []byte) (any, *outcome) {
	m, err := DecodeRelease(data)
	if err != nil {
		return nil, reject(reasonMalformed, err)
	}
	if o := c.sameExperiment("release", m.Experiment); o != nil {
		return nil, o
	}
	if m.Peer != from.String() {
		return nil, rejectf(reasonAuthorMismatch, "release for round %d names peer %s", m.Round, m.Peer)
	}
	return m, nil
}

func (c *checker) checkHead(from peer.ID, data []byte) (any, *outcome) {
	if !c.isValidator(from) {
		return nil, rejectf(reasonNotValidator, "head from %s, not a validator", from)
	}
	m, h, err := DecodeHead(data)
	if err != nil {
		return nil, reject(reasonMalformed, err)
	}
	if o := c.sameExperiment("head", m.Experiment); o != nil {
		return nil, o
	}
	if h.Network != c.network || h.Experiment != c.experiment {
		return nil, rejectf(reasonWrongExperiment, "head round %d is for %s/%s, want %s/%s", h.Round, h.Network, h.Experiment, c.network, c.experiment)
	}
	id := m.Signed.ID()
	byAuthor := false
	for _, s := range m.Signed.Sigs {
		if err := chain.VerifySignature(id, s); err != nil {
			return nil, reject(reasonBadSignature, fmt.Errorf("head %s round %d: %w", id, h.Round, err))
		}
		byAuthor = byAuthor || s.Peer == from.String()
	}
	// The publisher must vouch for the head it spreads with its own signature, so every head
	// on the wire is attributable to a validator that checked it.
	if !byAuthor {
		return nil, rejectf(reasonNoAuthorSig, "head %s round %d carries no signature by its publisher %s", id, h.Round, from)
	}
	return m, nil
}

func (c *checker) checkAttestation(from peer.ID, data []byte) (any, *outcome) {
	if !c.isValidator(from) {
		return nil, rejectf(reasonNotValidator, "attestation from %s, not a validator", from)
	}
	m, err := DecodeAttestation(data)
	if err != nil {
		return nil, reject(reasonMalformed, err)
	}
	if o := c.sameExperiment("attestation", m.Experiment); o != nil {
		return nil, o
	}
	if m.Sig.Peer != from.String() {
		return nil, rejectf(reasonAuthorMismatch, "attestation published by %s is signed by %s", from, m.Sig.Peer)
	}
	id, err := cid.Cast(m.Head) // DecodeAttestation checked it; cast again for the value
	if err != nil {
		return nil, reject(reasonMalformed, fmt.Errorf("%w: attestation head: %v", ErrMalformed, err))
	}
	if err := chain.VerifySignature(id, m.Sig); err != nil {
		return nil, reject(reasonBadSignature, fmt.Errorf("attestation of head %s: %w", id, err))
	}
	return m, nil
}

func (c *checker) sameExperiment(what, got string) *outcome {
	if got != c.experiment {
		return rejectf(reasonWrongExperiment, "%s for experiment %q, want %q", what, got, c.experiment)
	}
	return nil
}
