package merge

import "github.com/p2pnode/p2pnode/internal/parallel"

// tileLen is the number of elements the weighted-sum kernel finishes across all inputs
// before moving on. The dst tile (8 KiB) stays in L1 while groups of four inputs stream
// past it, so dst is read from and written to memory once however many inputs there are.
const tileLen = 2048

// weightedSum sets dst[i] = Σ_k float32(coef[k]·xs[k][i]) with the terms added in k order
// in float32, starting from the k = 0 term: ((t0 + t1) + t2) + …
//
// Inputs are consumed four at a time to cut dst traffic, but the additions stay strictly
// sequential in k, so the result is the same as the naive loop. Every product is wrapped in
// float32(…): the Go spec lets a compiler fuse x*y + z into an FMA (it does on arm64,
// ppc64le, s390x and amd64 v3), which would skip the product's rounding and change bits
// across architectures; an explicit conversion forbids that fusion.
//
// Callers have checked that every xs[k] is as long as dst and len(coef) == len(xs) ≥ 1.
func weightedSum(dst []float32, xs [][]float32, coef []float32, workers int) {
	parallel.ForChunks(len(dst), parallel.ChunkLen, workers, func(_, lo, hi int) {
		for t := lo; t < hi; t += tileLen {
			sumTile(dst, xs, coef, t, min(t+tileLen, hi))
		}
	})
}

// sumTile computes dst[lo:hi] from all inputs, four inputs per pass.
func sumTile(dst []float32, xs [][]float32, coef []float32, lo, hi int) {
	d := dst[lo:hi]
	for k := 0; k < len(xs); {
		g := min(4, len(xs)-k)
		first := k == 0
		switch g {
		case 4:
			if first {
				set4(d, xs[k][lo:hi], xs[k+1][lo:hi], xs[k+2][lo:hi], xs[k+3][lo:hi], coef[k], coef[k+1], coef[k+2], coef[k+3])
			} else {
				add4(d, xs[k][lo:hi], xs[k+1][lo:hi], xs[k+2][lo:hi], xs[k+3][lo:hi], coef[k], coef[k+1], coef[k+2], coef[k+3])
			}
		case 3:
			if first {
				set3(d, xs[k][lo:hi], xs[k+1][lo:hi], xs[k+2][lo:hi], coef[k], coef[k+1], coef[k+2])
			} else {
				add3(d, xs[k][lo:hi], xs[k+1][lo:hi], xs[k+2][lo:hi], coef[k], coef[k+1], coef[k+2])
			}
		case 2:
			if first {
				set2(d, xs[k][lo:hi], xs[k+1][lo:hi], coef[k], coef[k+1])
			} else {
				add2(d, xs[k][lo:hi], xs[k+1][lo:hi], coef[k], coef[k+1])
			}
		default:
			if first {
				set1(d, xs[k][lo:hi], coef[k])
			} else {
				add1(d, xs[k][lo:hi], coef[k])
			}
		}
		k += g
	}
}

// The re-slices a = a[:len(d)] let the compiler drop bounds checks in the loops.
// Go evaluates a + b + c left to right, so each line adds its terms in k order.

func set1(d, a []float32, wa float32) {
	a = a[:len(d)]
	for i := range d {
		d[i] = float32(wa * a[i])
	}
}

func set2(d, a, b []float32, wa, wb float32) {
	a, b = a[:len(d)], b[:len(d)]
	for i := range d {
		d[i] = float32(wa*a[i]) + float32(wb*b[i])
	}
}

func set3(d, a, b, c []float32, wa, wb, wc float32) {
	a, b, c = a[:len(d)], b[:len(d)], c[:len(d)]
	for i := range d {
		d[i] = float32(wa*a[i]) + float32(wb*b[i]) + float32(wc*c[i])
	}
}

func set4(d, a, b, c, e []float32, wa, wb, wc, we float32) {
	a, b, c, e = a[:len(d)], b[:len(d)], c[:len(d)], e[:len(d)]
	for i := range d {
		d[i] = float32(wa*a[i]) + float32(wb*b[i]) + float32(wc*c[i]) + float32(we*e[i])
	}
}

func add1(d, a []float32, wa float32) {
	a = a[:len(d)]
	for i := range d {
		d[i] = d[i] + float32(wa*a[i])
	}
}

func add2(d, a, b []float32, wa, wb float32) {
	a, b = a[:len(d)], b[:len(d)]
	for i := range d {
		d[i] = d[i] + float32(wa*a[i]) + float32(wb*b[i])
	}
}

func add3(d, a, b, c []float32, wa, wb, wc float32) {
	a, b, c = a[:len(d)], b[:len(d)], c[:len(d)]
	for i := range d {
		d[i] = d[i] + float32(wa*a[i]) + float32(wb*b[i]) + float32(wc*c[i])
	}
}

func add4(d, a, b, c, e []float32, wa, wb, wc, we float32) {
	a, b, c, e = a[:len(d)], b[:len(d)], c[:len(d)], e[:len(d)]
	for i := range d {
		d[i] = d[i] + float32(wa*a[i]) + float32(wb*b[i]) + float32(wc*c[i]) + float32(we*e[i])
	}
}
