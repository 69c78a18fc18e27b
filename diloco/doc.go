// Package diloco holds the DiLoCo math: pseudo-gradients (base − local), the codecs that
// encode them for the wire (fp32, fp16, blockwise int8 with error feedback) and the outer
// Nesterov-momentum SGD optimizer with its state. Pure functions on flat float32 vectors; no
// I/O; of this module it imports only the leaves codecs and internal/parallel; deterministic
// whatever the goroutine count.
//
// Determinism is bit-exact and holds on every architecture: work is split over elements
// (each element computed by one goroutine, blocks of an int8 encoding kept whole), and
// every float32 product is wrapped in an explicit float32(…) conversion so that no compiler
// may fuse it into an FMA. The momentum buffer is the only optimizer state; it has the
// length of the parameters and starts as zeros. Encoded values are the in-memory form of
// the delta files described in docs/formats.md; the pack package owns the file layout.
// Heavy functions take a trailing workers argument (0 = GOMAXPROCS).
package diloco
