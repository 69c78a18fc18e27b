// Package node is the composition root: it wires the node's parts with go.uber.org/fx from
// the config (stores, identity, libp2p host, Python runtime, dataset, bus, role loops, HTTP
// status) and runs the role loops. It does no math and defines no byte formats; the loops
// call round, lease, chain and gossip for that.
package node
