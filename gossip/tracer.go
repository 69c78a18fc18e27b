package gossip

import (
	"strings"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// tracer counts what pubsub drops where our validators cannot see it (a full validation
// or outbound queue, an RPC too big to send, a subscriber too slow, an envelope signature
// that does not verify) and the duplicates it filters. Without it a lossy burst would be
// silent. Pubsub calls it from its event loop, so every method only bumps a counter.
type tracer struct {
	m      *metrics
	kindOf map[string]Kind // full topic name → kind; fixed before pubsub starts
}

var _ pubsub.RawTracer = (*tracer)(nil)

func (t *tracer) kind(topic string) Kind {
	if k, ok := t.kindOf[topic]; ok {
		return k
	}
	return "other"
}

func (t *tracer) RejectMessage(msg *pubsub.Message, reason string) {
	switch reason {
	case pubsub.RejectValidationFailed, pubsub.RejectValidationIgnored:
		return // our validator counted it, with a finer reason
	}
	t.m.dropped.WithLabelValues(string(t.kind(msg.GetTopic())), strings.ReplaceAll(reason, " ", "_")).Inc()
}

func (t *tracer) DuplicateMessage(msg *pubsub.Message) {
	t.m.outcome(t.kind(msg.GetTopic()), "ignore", reasonDuplicate)
}

func (t *tracer) UndeliverableMessage(msg *pubsub.Message) {
	t.m.dropped.WithLabelValues(string(t.kind(msg.GetTopic())), "slow_consumer").Inc()
}

func (t *tracer) DropRPC(rpc *pubsub.RPC, _ peer.ID) {
	for _, msg := range rpc.GetPublish() {
		t.m.dropped.WithLabelValues(string(t.kind(msg.GetTopic())), "outbound_dropped").Inc()
	}
}

func (t *tracer) OnNewOutboundStream(peer.ID, protocol.ID) {}
func (t *tracer) OnClosedOutboundStream(peer.ID)           {}
func (t *tracer) Join(string)                              {}
func (t *tracer) Leave(string)                             {}
func (t *tracer) Graft(peer.ID, string)                    {}
func (t *tracer) Prune(peer.ID, string)                    {}
func (t *tracer) ValidateMessage(*pubsub.Message)          {}
func (t *tracer) DeliverMessage(*pubsub.Message)           {}
func (t *tracer) ThrottlePeer(peer.ID)                     {}
func (t *tracer) RecvRPC(*pubsub.RPC)                      {}
func (t *tracer) SendRPC(*pubsub.RPC, peer.ID)             {}
