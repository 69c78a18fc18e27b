// Package node is the composition root: it wires the node's parts with go.uber.org/fx from
// the config (stores, identity, libp2p host, Python runtime, dataset, bus, HTTP status),
// gives each role in experiment.roles its own fx module, and runs the role loops after
// start-up. The trainer role and head sync are packages of their own (trainer, headsync);
// the validator role still lives here (validator.go, leader.go, follower.go,
// stepaside.go). It does no math and defines no byte formats; the loops call round, lease,
// chain and gossip for that.
package node
