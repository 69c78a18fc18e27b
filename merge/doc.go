// Package merge holds the pure functions that combine contributions into a new model:
// screening of deltas (finite values, norm bounds, cosine to the others), the weighted
// mean, EMA and the robust aggregators (trimmed mean, coordinate median, norm clipping). It
// does no I/O and imports nothing of this module: inputs are flat float32 vectors in pack
// order, and every result is bit-identical whatever the goroutine count.
//
// Validators recompute each other's merges and compare CIDs, so every function here is
// deterministic to the bit on every architecture:
//
//   - work is split over elements, never over contributions: each output element is
//     computed by one goroutine, adding contributions in index order k = 0…K−1;
//   - reductions (norms, dots) keep float64 partials over fixed chunks of 64Ki elements,
//     independent of the worker count, and add them in chunk order;
//   - every float32 product is wrapped in an explicit float32(…) conversion, which the Go
//     spec requires to round, so no compiler may fuse it into an FMA;
//   - orderings (trimmed mean, median) use the IEEE 754 total order, ties broken by index.
//
// Contribution order is part of the input: callers pass contributions sorted canonically
// (by peer id). Heavy functions take a trailing workers argument (0 = GOMAXPROCS).
//
// At scale nothing here needs the contributions whole: Screening takes them block by
// block in at most two O(K·n) passes (one reference per round, not one per pair), and
// AggregateBlock aggregates a block given the whole inputs' norms, with the bits of the
// whole-vector functions; a validator streams contributions from disk through them. The
// screening bars are calibrated on History, the statistics of what earlier rounds merged,
// which heads carry so that every validator reaches the same verdicts.
package merge
