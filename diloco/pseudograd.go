package diloco

import (
	"fmt"

	"github.com/p2pnode/p2pnode/internal/parallel"
)

// PseudoGradient sets dst = base − local elementwise: the DiLoCo pseudo-gradient, which
// points from the trained model back to the round's base so that an outer SGD step with
// lr 1 and no momentum lands on local. dst may alias base or local.
func PseudoGradient(dst, base, local []float32, workers int) error {
	if len(base) != len(dst) || len(local) != len(dst) {
		return fmt.Errorf("pseudo-gradient: %w: dst %d, base %d, local %d elements", ErrLengthMismatch, len(dst), len(base), len(local))
	}
	parallel.ForChunks(len(dst), parallel.ChunkLen, workers, func(_, lo, hi int) {
		d, b, l := dst[lo:hi], base[lo:hi], local[lo:hi]
		b, l = b[:len(d)], l[:len(d)]
		for i := range d {
			d[i] = b[i] - l[i]
		}
	})
	return nil
}
