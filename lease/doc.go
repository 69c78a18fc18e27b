// Package lease owns who trains what: the round leader choice, lease issue, expiry and
// reassignment, and the microshard ledger that proves every microshard is trained exactly
// once per epoch. It does not touch the network.
package lease
