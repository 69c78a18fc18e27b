// Package round owns the work of one training round, independent of how nodes talk: a
// trainer turns a lease into a contribution (train in the worker, Δ = base − local, encode,
// store), and a validator turns a base head and contributions into the next head (decode,
// screen, aggregate, outer step or EMA, store, ledger). The same merge run by two validators
// gives the same head CID, which is what attestation checks.
package round
