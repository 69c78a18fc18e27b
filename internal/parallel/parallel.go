// Package parallel splits work on long vectors over goroutines in fixed-size chunks, so that
// an elementwise function gives the same bits, and a chunked reduction the same partials,
// whatever the goroutine count. merge and diloco share it; it knows nothing of models.
package parallel

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// ChunkLen is the fixed number of elements a goroutine takes at a time. Reductions keep one
// float64 partial per chunk and add the partials in chunk order, so their summation order
// depends only on the vector length — never on the worker count. 64Ki float32 is 256 KiB per
// input: large enough to amortise scheduling, small enough to balance two to dozens of cores.
const ChunkLen = 1 << 16

// Workers maps the public workers argument to a goroutine count: 0 (or a negative
// value, which we treat the same rather than fail) means runtime.GOMAXPROCS(0).
func Workers(workers int) int {
	if workers <= 0 {
		return runtime.GOMAXPROCS(0)
	}
	return workers
}

// NumChunks is ceil(n/size) without the overflow of (n+size-1)/size.
func NumChunks(n, size int) int {
	c := n / size
	if n%size != 0 {
		c++
	}
	return c
}

// ForChunks calls fn(c, lo, hi) once for every chunk c = [c·size, min((c+1)·size, n)),
// spreading chunks over up to workers goroutines. Each element lies in exactly one chunk, so
// an elementwise fn produces the same bits whatever the worker count, and a reduction that
// stores its result in slot c gets the same partials.
func ForChunks(n, size, workers int, fn func(c, lo, hi int)) {
	if n <= 0 {
		return
	}
	chunks := NumChunks(n, size)
	w := min(Workers(workers), chunks)
	run := func(c int) {
		lo := c * size
		fn(c, lo, lo+min(size, n-lo))
	}
	if w == 1 {
		for c := range chunks {
			run(c)
		}
		return
	}
	// Chunks are handed out through a counter rather than split statically so that a
	// goroutine descheduled by the OS does not hold up the whole call.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range w {
		wg.Go(func() {
			for {
				c := int(next.Add(1) - 1)
				if c >= chunks {
					return
				}
				run(c)
			}
		})
	}
	wg.Wait()
}

// ReduceChunks runs fn over every fixed chunk of [0,n) with m float64 accumulators per
// chunk and returns the m totals, adding chunk partials in chunk order.
func ReduceChunks(n, workers, m int, fn func(lo, hi int, acc []float64)) []float64 {
	total := make([]float64, m)
	if n <= 0 {
		return total
	}
	chunks := NumChunks(n, ChunkLen)
	partials := make([]float64, chunks*m)
	ForChunks(n, ChunkLen, workers, func(c, lo, hi int) {
		fn(lo, hi, partials[c*m:(c+1)*m])
	})
	for c := range chunks {
		for j, p := range partials[c*m : (c+1)*m] {
			total[j] += p
		}
	}
	return total
}
