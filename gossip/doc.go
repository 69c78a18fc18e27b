// Package gossip owns the experiment's GossipSub topics, the typed signed messages on them,
// their topic validators and message ids. It knows nothing about training.
//
// # Topics
//
// Each experiment has six topics, /p2ptrain/<network>/<experiment>/<kind>:
//
//	heads          *Head         a signed head (proposal or canonical)    validators only
//	leases         *Leases       the round leader's lease grant            validators only
//	contributions  *Contribution a trainer's result for a lease            anyone
//	peers          *Announce     periodic "I am here"                      anyone
//	attestations   *Attestation  a validator's signature over a head       validators only
//	releases       *Release      a lease its trainer cannot finish         its trainer only
//
// New joins and subscribes all of them; Publish routes a message by its type; Messages
// yields every message that passed validation, ours included, decoded once.
//
// # Validation
//
// Messages are signed by their author (StrictSign), so msg.GetFrom() is who wrote them, not
// who relayed them. One ValidatorEx per topic decodes the bytes once (the Decode*
// functions) and applies, cheapest check first:
//
//   - Reject (forged or malformed; the relaying peer is at fault): bigger than the topic's
//     bound; not decodable; another experiment (or, for heads, another network); on the
//     validator-only topics, an author outside the validator set; an Announce or
//     Contribution whose Peer, or Leases whose Issuer, is not the author; a head with any
//     signature that does not verify, or none by its author; an Attestation not signed by
//     its author or whose signature does not verify; a validator that panics.
//   - Ignore (stale; nobody's fault): an Announce whose Time is more than MaxClockSkew (2
//     minutes) from our clock, either way; Leases whose Deadline passed more than
//     MaxClockSkew ago. Duplicates never reach the validator: pubsub drops a message id it
//     has seen within SeenTTL (5 minutes, longer than the announce window), and counts it.
//
// Publish runs the same checks on our own message first and returns why it would be refused
// (errors.Is ErrRejected or ErrIgnored, and the cause such as ErrMalformed); nothing is sent.
// An empty validator set trusts nobody: heads, leases and attestations are all refused.
//
// # Message ids
//
// Ids are content hashes, so the same bytes from two publishers are one message. The topic
// is hashed in (pubsub's seen-cache is shared across topics). On heads the id is the data
// alone: several validators re-publish the same signed head. On the other topics, whose
// messages each name their only legitimate author, the author is hashed in too, so that a
// forged copy under another key, rejected on arrival, cannot make the genuine message look
// like a duplicate. On heads a non-validator can still do that to its direct neighbours for
// SeenTTL; peer scoring (not enabled yet) would be the remedy.
//
// # Settings that differ from pubsub's defaults
//
//   - Outbound queue per peer, validation queue and subscription buffers: 1024 (QueueSize).
//     At the default 32, a burst of 100 messages loses most of them.
//   - Flood publish on: our own messages go to every connected subscriber rather than
//     only the mesh, so they are one hop from our neighbours and are not lost when published
//     before the first heartbeat has built a mesh.
//   - Maximum wire message: the biggest topic bound (heads) plus 64 KiB of envelope.
//   - Seen-messages TTL 5 minutes (default 2), to cover the announce clock window.
//
// # Metrics (prefix p2ptrain_gossip_)
//
// messages_total{topic,result,reason} counts every validation outcome (accept/ok, reject/*,
// ignore/stale, ignore/duplicate); published_total{topic} and publish_errors_total
// {topic,reason} count our own publishing; dropped_total{topic,reason} counts what pubsub
// drops before or after validation (full queues, slow consumer, bad envelope signatures).
// Rejections are logged at warn once per (author, reason) per 10 minutes, at most 20 lines
// a minute.
//
// Start Gossip before the host dials peers: a peer that connects before our pubsub
// handles the protocol can stay half-attached in pubsub (messages arrive from it but none
// are sent to it; seen on mocknet), which shows up as dropped_total{reason="outbound_dropped"}.
package gossip
