// Package node is the composition root: it wires the node's parts with go.uber.org/fx from
// the config (stores, identity, libp2p host, Python runtime, dataset, bus, HTTP status),
// gives each role in experiment.roles its own fx module, and runs the role loops after
// start-up. The parts are built by packages of their own (p2p, status, upkeep, and the
// roles validator, trainer, headsync); node says which run together and wires each to the
// bus, the chain, the status page and the metrics. It does no math and defines no byte
// formats; the loops call round, lease, chain and gossip for that.
package node
