package gossip

import (
	"context"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
)

// validator is the topic validator pubsub runs on every message of kind k before it is
// delivered or forwarded. It decodes once and leaves the value in msg.ValidatorData for the
// subscription reader. Nothing a peer sends may crash the node: a panic is a Reject.
func (g *Gossip) validator(k Kind) pubsub.ValidatorEx {
	return func(_ context.Context, via peer.ID, msg *pubsub.Message) (res pubsub.ValidationResult) {
		var author peer.ID
		defer func() {
			if r := recover(); r != nil {
				o := rejectf(reasonPanic, "validator panicked: %v", r)
				g.metrics.outcome(k, resultName(o.result), o.reason)
				g.rejects.reject(g.check.now(), k, author, via, o)
				res = pubsub.ValidationReject
			}
		}()
		author = msg.GetFrom()
		// Our own Publish already ran the checks and attached the value; remote messages
		// never arrive with validator data.
		if via == g.self && author == g.self && msg.ValidatorData != nil {
			g.metrics.outcome(k, "accept", reasonOK)
			return pubsub.ValidationAccept
		}
		v, o := g.check.check(k, author, msg.GetData())
		if o != nil {
			g.metrics.outcome(k, resultName(o.result), o.reason)
			if o.result == pubsub.ValidationReject {
				g.rejects.reject(g.check.now(), k, author, via, o)
			} else {
				g.log.Debug("ignored gossip message", "topic", string(k), "peer", author, "via", via, "reason", o.reason, "err", o.err)
			}
			return o.result
		}
		msg.ValidatorData = v
		g.metrics.outcome(k, "accept", reasonOK)
		return pubsub.ValidationAccept
	}
}
