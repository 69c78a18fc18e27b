package gossip

import (
	"crypto/sha256"
	"encoding/binary"

	pb "github.com/libp2p/go-libp2p-pubsub/pb"
)

// Message ids are content-based: GossipSub dedupes by id, and the default id (author and
// sequence number) would let the same bytes published by two nodes travel twice.
//
// The topic is part of every id because pubsub's seen-cache is shared by all topics: without
// it, a copy of a head's bytes published first on another topic (where it fails validation)
// would make the genuine head look like a duplicate.
//
// contentID (data only) is for heads, where several validators legitimately publish the
// same signed head and consumers want it once.
//
// authoredID adds the StrictSign-verified author for the other topics. Each of their
// messages names its one legitimate author (Announce.Peer, Contribution.Peer, Leases.Issuer,
// Attestation.Sig.Peer), so a copy from anyone else is rejected anyway; keying it apart
// means such a copy, if it arrives first, cannot shadow the genuine message as a
// "duplicate" for the seen-cache lifetime.

func contentID(m *pb.Message) string { return msgID(m.GetTopic(), nil, m.Data) }

func authoredID(m *pb.Message) string { return msgID(m.GetTopic(), m.From, m.Data) }

func msgID(topic string, from, data []byte) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	// Length prefixes keep (topic, from, data) triples from colliding by concatenation.
	h.Write(binary.AppendUvarint(n[:0], uint64(len(topic))))
	h.Write([]byte(topic))
	h.Write(binary.AppendUvarint(n[:0], uint64(len(from))))
	h.Write(from)
	h.Write(data)
	return string(h.Sum(nil))
}

// idFunc is the message id rule of a topic.
func (k Kind) idFunc() func(*pb.Message) string {
	if k == KindHeads {
		return contentID
	}
	return authoredID
}
