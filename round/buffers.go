package round

import (
	"fmt"
	"slices"
	"strings"

	"github.com/p2pnode/p2pnode/pack"
)

// BuffersMeta is the pack metadata key that names, comma-separated, the tensors that are
// buffers rather than weights (BatchNorm running statistics). The worker writes it; heads'
// parameter packs carry it on from genesis.
const BuffersMeta = "buffers"

// valueRange is [lo, hi) of a pack's concatenated values.
type valueRange struct{ lo, hi int }

// bufferRanges returns the value ranges of the buffer tensors a pack's metadata names, in
// layout order, and the metadata to write into the next pack (nil when there are none).
// A name that is not a tensor of the layout is an error.
func bufferRanges(layout pack.Layout, meta map[string]string) ([]valueRange, map[string]string, error) {
	spec := meta[BuffersMeta]
	if spec == "" {
		return nil, nil, nil
	}
	names := strings.Split(spec, ",")
	var out []valueRange
	var off int64
	found := 0
	for _, e := range layout {
		n := e.Elements()
		if slices.Contains(names, e.Name) {
			out = append(out, valueRange{int(off), int(off + n)})
			found++
		}
		off += n
	}
	if found != len(names) {
		for _, name := range names {
			if !slices.ContainsFunc(layout, func(e pack.Entry) bool { return e.Name == name }) {
				return nil, nil, fmt.Errorf("%w: pack metadata names buffer %q, which is not a tensor of the layout", pack.ErrMalformed, name)
			}
		}
		return nil, nil, fmt.Errorf("%w: pack metadata names a buffer twice: %q", pack.ErrMalformed, spec)
	}
	return out, map[string]string{BuffersMeta: spec}, nil
}

// averageBuffers undoes the outer step on the buffers inside block [lo, lo+len(p)): there
// the next value is base − g, the aggregate of the trainers' own values (with the mean
// aggregator, their weighted average), and the momentum stays 0. base holds the block's
// base values (read before the step changed p).
func averageBuffers(ranges []valueRange, lo int, p, mom, base, g []float32) {
	hi := lo + len(p)
	for _, r := range ranges {
		a, b := max(r.lo, lo), min(r.hi, hi)
		for i := a; i < b; i++ {
			j := i - lo
			p[j] = base[j] - g[j]
			if mom != nil {
				mom[j] = 0
			}
		}
	}
}
