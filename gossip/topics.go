package gossip

import (
	"errors"
	"fmt"
)

// ErrUnknownMessage is returned by Publish for a value that is not one of our message types.
var ErrUnknownMessage = errors.New("unknown gossip message type")

// Kind names a topic inside an experiment's namespace.
type Kind string

// The experiment's topics. Attestations travel apart from heads so that a validator's
// signature (a few hundred bytes) does not re-send the whole head.
const (
	KindHeads         Kind = "heads"
	KindLeases        Kind = "leases"
	KindContributions Kind = "contributions"
	KindPeers         Kind = "peers"
	KindAttestations  Kind = "attestations"
	KindReleases      Kind = "releases"
)

// kinds is every topic a node joins, in a fixed order (used for start-up and tests).
var kinds = []Kind{KindHeads, KindLeases, KindContributions, KindPeers, KindAttestations, KindReleases}

// TopicName is the GossipSub topic of one kind of message in an experiment.
func TopicName(network, experiment, kind string) string {
	return "/p2ptrain/" + network + "/" + experiment + "/" + kind
}

// maxBytes is the largest encoded message each topic carries; the validator rejects
// anything bigger before decoding it.
func (k Kind) maxBytes() int {
	switch k {
	case KindHeads:
		return MaxHeadBytes
	case KindLeases:
		return MaxLeasesBytes
	case KindContributions:
		return MaxContributionBytes
	case KindPeers:
		return MaxAnnounceBytes
	case KindAttestations:
		return MaxAttestationBytes
	case KindReleases:
		return MaxReleaseBytes
	}
	return 0
}

// maxTopicBytes is the biggest bound over all topics: the wire limit is sized from it.
func maxTopicBytes() int {
	n := 0
	for _, k := range kinds {
		n = max(n, k.maxBytes())
	}
	return n
}

// kindOf routes a message value to its topic.
func kindOf(msg any) (Kind, error) {
	switch msg.(type) {
	case *Head:
		return KindHeads, nil
	case *Leases:
		return KindLeases, nil
	case *Contribution:
		return KindContributions, nil
	case *Announce:
		return KindPeers, nil
	case *Attestation:
		return KindAttestations, nil
	case *Release:
		return KindReleases, nil
	}
	return "", fmt.Errorf("%w: %T", ErrUnknownMessage, msg)
}
