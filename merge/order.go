package merge

import (
	"math"
	"slices"
)

// orderKey maps a float32 to a uint32 whose unsigned order is the IEEE 754 total order:
// −NaN < −Inf < … < −0 < +0 < … < +Inf < +NaN. Sorting by it is a strict, deterministic
// order even for NaNs and signed zeros, which float comparison (<) is not.
func orderKey(v float32) uint32 {
	b := math.Float32bits(v)
	if b&0x80000000 != 0 {
		return ^b
	}
	return b | 0x80000000
}

// rankByCounting is the cohort size up to which rankKeys counts instead of sorting.
// Counting is K² comparisons but branch-free; a sort of a handful of random keys spends
// its time in mispredicted branches. Above this size the sort's K·log K wins.
const rankByCounting = 24

// rankKeys sets rank[k] to the position keys[k] would have in ascending order. Keys must
// be distinct (callers put the input index in the low bits), so ranks are a permutation of
// 0…K−1 and both methods give the same answer. keys may be reordered.
func rankKeys(keys []uint64, rank []int) {
	if len(keys) > rankByCounting {
		slices.Sort(keys)
		for pos, key := range keys {
			rank[uint32(key)] = pos
		}
		return
	}
	for k, a := range keys {
		r := 0
		for _, b := range keys {
			if b < a {
				r++
			}
		}
		rank[k] = r
	}
}

// sortKey orders coordinate values by the IEEE total order, then by input index.
func sortKey(v float32, k int) uint64 { return uint64(orderKey(v))<<32 | uint64(k) }

// medianSorted returns the median of ascending float64s: the middle value, or for an even
// count the mean of the two middle ones. It returns 0 for an empty slice.
func medianSorted(s []float64) float64 {
	n := len(s)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return s[n/2]
	default:
		// Halve first so two huge values cannot overflow. The compiler turns /2 into *0.5,
		// which it could fuse with the add; the conversions keep each half rounded.
		return float64(s[n/2-1]/2) + float64(s[n/2]/2)
	}
}
