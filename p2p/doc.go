// Package p2p builds the node's side of libp2p: the host (transports, security, muxer,
// resource and connection managers, private networks), the identity key, discovery
// (kept bootstrap peers and validators, the Kademlia DHT, mDNS), connection slots,
// bandwidth counters, and NetBus, the bus.Bus over GossipSub and the artifact exchange.
// It holds constructors only; node decides which of them run.
package p2p
