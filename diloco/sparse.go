package diloco

import (
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/p2pnode/p2pnode/internal/parallel"
)

// The sparse codec (SparseLoCo-style): per block of B values keep the k of largest
// magnitude, send each as 2 bits (sign, and which of the block's two scales) and send their
// positions Elias–Fano coded. Everything else stays in the error-feedback residual.
//
// Layout, for n values, block size B and top-k K (docs/formats.md has the byte-level rules):
// block b covers [b·B, min((b+1)·B, n)) of length L and keeps k = min(K, L) values. Every
// block's record has a size that depends only on (L, K), so all full blocks are the same
// size and block b's bytes start at b × the full size: a block range decodes without
// reading the blocks before it.
//
//   - Scales: two float32 per block, (lo, hi), finite and ≥ 0.
//   - Data: per block ⌈2k/8⌉ bytes, value j (in position order) in bits 2(j%4)…2(j%4)+1
//     of byte j/4; bit 0 is the sign (1 = negative), bit 1 picks hi (1) or lo (0). A
//     value decodes as ±scale, copied, never computed. Padding bits are 0.
//   - Index: per block the k positions p₀ < p₁ < … < p_{k−1} (relative to the block),
//     Elias–Fano with ℓ = ⌊log₂(L/k)⌋ low bits: first the k low parts (ℓ bits each), then
//     an upper bitmap of k + ((L−1) >> ℓ) + 1 bits where bit (p_j >> ℓ) + j is set; bits
//     are numbered from the least significant bit of each byte, the record is padded with
//     0 bits to a whole byte. A decoder rejects a bitmap without exactly k set bits,
//     positions not strictly increasing or ≥ L, and non-zero padding, so every accepted
//     record is the one encoding of its positions.

// Defaults of the sparse codec: 64 of 4096 values (1.56 %) per block.
const (
	DefaultSparseBlock = 4096
	DefaultSparseTopK  = 64
	// MaxSparseBlock bounds B so that a block's positions fit the decoder's uint32s and a
	// hostile header cannot make one block's scratch space huge.
	MaxSparseBlock = 1 << 24
	// maxSparseN bounds n so that the layout's byte counts (at most 10 per value, with 1-value
	// blocks) cannot overflow an int.
	maxSparseN = math.MaxInt / 16
)

// DefaultSparseTopKFor is the top-k that keeps the default ratio (64 of 4096, 1.56 %) in a
// block of the given size, at least 1.
func DefaultSparseTopKFor(block int) int {
	return max(1, block/(DefaultSparseBlock/DefaultSparseTopK))
}

// sparseGeom is the shape of one block's record.
type sparseGeom struct {
	L, k   int // block length, values kept
	low    int // ℓ, low bits per position
	upper  int // bits of the upper bitmap
	vBytes int // Data bytes
	iBytes int // Index bytes
}

func geomOf(L, K int) sparseGeom {
	g := sparseGeom{L: L, k: min(K, L)}
	if g.k > 0 && L/g.k >= 1 {
		g.low = bits.Len(uint(L/g.k)) - 1
	}
	g.upper = g.k + ((L - 1) >> g.low) + 1
	g.vBytes = (2*g.k + 7) / 8
	g.iBytes = (g.k*g.low + g.upper + 7) / 8
	return g
}

// sparseLayout describes a whole encoding: full-size blocks then one possibly shorter.
type sparseLayout struct {
	n, B, K    int
	blocks     int
	full, last sparseGeom
}

func layoutOf(n, B, K int) sparseLayout {
	s := sparseLayout{n: n, B: B, K: K, blocks: parallel.NumChunks(n, B)}
	s.full = geomOf(B, K)
	s.last = s.full
	if r := n % B; r != 0 {
		s.last = geomOf(r, K)
	}
	return s
}

func (s sparseLayout) geom(b int) sparseGeom {
	if b == s.blocks-1 {
		return s.last
	}
	return s.full
}

// dataOff and indexOff are where block b's record starts in Data and Index.
func (s sparseLayout) dataOff(b int) int  { return b * s.full.vBytes }
func (s sparseLayout) indexOff(b int) int { return b * s.full.iBytes }

func (s sparseLayout) dataLen() int {
	if s.blocks == 0 {
		return 0
	}
	return (s.blocks-1)*s.full.vBytes + s.last.vBytes
}

func (s sparseLayout) indexLen() int {
	if s.blocks == 0 {
		return 0
	}
	return (s.blocks-1)*s.full.iBytes + s.last.iBytes
}

// SparseWireBytes is the payload of a sparse encoding of n values (positions, 2-bit values
// and scales), without the file header: what Encoded.WireBytes returns for it.
func SparseWireBytes(n, block, topK int) int {
	s := layoutOf(n, block, topK)
	return s.dataLen() + s.indexLen() + 8*s.blocks
}

// checkSparseParams validates block size and top-k as given to the encoder or read from a
// file.
func checkSparseParams(block, topK int) error {
	if block < 1 || block > MaxSparseBlock {
		return fmt.Errorf("sparse block size %d not in [1, %d]", block, MaxSparseBlock)
	}
	if topK < 1 || topK > block {
		return fmt.Errorf("sparse top-k %d not in [1, block size %d]", topK, block)
	}
	return nil
}

// EncodeSparse encodes delta with the sparse codec: per block of block values (0 = 4096)
// the topK (0 = DefaultSparseTopKFor(block): 64 of 4096) of largest |x| (ties: the lower
// position), at 2 bits each. With residual != nil (error feedback) the value encoded is
// x = delta + float32(decay·residual) and afterwards residual = x − decode(encoded), in
// place — for the values not kept that is all of x, so nothing is lost, only delayed and,
// with decay < 1, discounted round by round (SparseLoCo's e ← β·e + Δ). decay must be in
// (0, 1]; 1 is plain error feedback and adds the residual exactly. The residual is written
// only when the encoding succeeds. Values must be finite. The two scales of a block are the
// means of |x| over the two groups that split the kept magnitudes (sorted) with the least
// squared error.
func EncodeSparse(delta, residual []float32, block, topK int, decay float64, workers int) (Encoded, error) {
	if block == 0 {
		block = DefaultSparseBlock
	}
	if topK == 0 {
		topK = DefaultSparseTopKFor(block)
	}
	if err := checkSparseParams(block, topK); err != nil {
		return Encoded{}, fmt.Errorf("encode: %w: %w", ErrBadConfig, err)
	}
	if residual != nil && len(residual) != len(delta) {
		return Encoded{}, fmt.Errorf("encode: %w: %d delta and %d residual elements", ErrLengthMismatch, len(delta), len(residual))
	}
	beta, err := feedbackDecay(decay)
	if err != nil {
		return Encoded{}, fmt.Errorf("encode: %w", err)
	}
	if len(delta) > maxSparseN {
		return Encoded{}, fmt.Errorf("encode: %w: %d values is more than the sparse codec's %d", ErrBadConfig, len(delta), maxSparseN)
	}
	if i := firstNonFinite(delta, residual, beta, workers); i >= 0 {
		if residual != nil {
			return Encoded{}, fmt.Errorf("encode: %w: element %d is delta %v + %v × residual %v", ErrNonFinite, i, delta[i], beta, residual[i])
		}
		return Encoded{}, fmt.Errorf("encode: %w: element %d is %v", ErrNonFinite, i, delta[i])
	}
	s := layoutOf(len(delta), block, topK)
	e := Encoded{Codec: Sparse, N: len(delta), BlockSize: block, TopK: topK,
		Data: make([]byte, s.dataLen()), Index: make([]byte, s.indexLen()), Scales: make([]float32, 2*s.blocks)}
	blocksPerChunk := max(1, parallel.ChunkLen/block)
	parallel.ForChunks(s.blocks, blocksPerChunk, workers, func(_, b0, b1 int) {
		sc := newSparseScratch(block, topK)
		for b := b0; b < b1; b++ {
			lo := b * block
			hi := min(lo+block, len(delta))
			g := s.geom(b)
			encodeSparseBlock(sc, g, delta[lo:hi], sub(residual, lo, hi), beta,
				e.Data[s.dataOff(b):s.dataOff(b)+g.vBytes], e.Index[s.indexOff(b):s.indexOff(b)+g.iBytes], e.Scales[2*b:2*b+2])
		}
	})
	return e, nil
}

type sparseScratch struct {
	x    []float32
	keys []uint64
	pos  []int
	mags []float64
	hi   []bool
}

func newSparseScratch(block, topK int) *sparseScratch {
	return &sparseScratch{x: make([]float32, block), keys: make([]uint64, block),
		pos: make([]int, topK), mags: make([]float64, topK), hi: make([]bool, block)}
}

// encodeSparseBlock encodes one block: x = d + float32(decay·r) (d alone when r is nil),
// then the record of x's top k and, with r, the new residual.
func encodeSparseBlock(sc *sparseScratch, g sparseGeom, d, r []float32, decay float32, data, index []byte, scales []float32) {
	x := sc.x[:g.L]
	keys := sc.keys[:g.L]
	for i, v := range d {
		if r != nil {
			// float32(…) keeps the product's rounding: no FMA (internal/fmacheck), and
			// decay 1 adds r[i] exactly.
			v += float32(decay * r[i])
		}
		x[i] = v
		// A larger key is a larger magnitude, then a lower position: every key is distinct.
		keys[i] = uint64(math.Float32bits(v)&0x7fffffff)<<32 | uint64(^uint32(i))
	}
	selectLargest(keys, g.k)
	top := keys[:g.k]
	slices.Sort(top)
	slices.Reverse(top) // magnitudes descending
	mags := sc.mags[:g.k]
	for j, key := range top {
		mags[j] = float64(math.Float32frombits(uint32(key >> 32)))
	}
	split := bestSplit(mags)
	var hiSum, loSum float64
	for j, m := range mags {
		if j < split {
			hiSum += m
		} else {
			loSum += m
		}
	}
	var sHi, sLo float32
	if split > 0 {
		sHi = float32(hiSum / float64(split))
	}
	if split < g.k {
		sLo = float32(loSum / float64(g.k-split))
	}
	scales[0], scales[1] = sLo, sHi
	isHi := sc.hi[:g.L]
	clear(isHi)
	pos := sc.pos[:g.k]
	for j, key := range top {
		p := int(^uint32(key))
		pos[j] = p
		isHi[p] = j < split
	}
	slices.Sort(pos)
	if r != nil {
		copy(r, x) // values not kept go back whole; kept ones are overwritten below
	}
	w := bitWriter{buf: index}
	for _, p := range pos {
		w.write(uint64(p), g.low)
	}
	for j, p := range pos {
		w.setBit(g.k*g.low + (p >> g.low) + j)
	}
	for j, p := range pos {
		code := byte(0)
		v := x[p]
		if math.Signbit(float64(v)) {
			code |= 1
		}
		scale := sLo
		if isHi[p] {
			code |= 2
			scale = sHi
		}
		data[j/4] |= code << (2 * (j % 4))
		if r != nil {
			dec := scale
			if code&1 != 0 {
				dec = -scale
			}
			r[p] = v - dec
		}
	}
}

// bestSplit returns s in [1, len(m)] such that quantizing m[:s] (descending magnitudes) to
// their mean and m[s:] to theirs has the least squared error (the lowest s on ties): the
// optimal two-level quantizer of sorted data splits it in one place.
func bestSplit(m []float64) int {
	var tot, tot2 float64
	for _, v := range m {
		tot += v
		tot2 += float64(v * v)
	}
	best, bestErr := len(m), math.Inf(1)
	var s1, s2 float64
	for s := 1; s <= len(m); s++ {
		s1 += m[s-1]
		s2 += float64(m[s-1] * m[s-1])
		e := s2 - s1*s1/float64(s)
		if rest := len(m) - s; rest > 0 {
			r1, r2 := tot-s1, tot2-s2
			e += r2 - r1*r1/float64(rest)
		}
		if e < bestErr {
			best, bestErr = s, e
		}
	}
	return best
}

// selectLargest reorders keys so that keys[:k] are its k largest (in any order); keys are
// distinct. Hoare quickselect with a median-of-three pivot.
func selectLargest(keys []uint64, k int) {
	lo, hi := 0, len(keys)-1
	t := k - 1
	for lo < hi {
		a, b, c := keys[lo], keys[lo+(hi-lo)/2], keys[hi]
		p := max(min(a, b), min(max(a, b), c))
		i, j := lo, hi
		for i <= j {
			for keys[i] > p {
				i++
			}
			for keys[j] < p {
				j--
			}
			if i <= j {
				keys[i], keys[j] = keys[j], keys[i]
				i++
				j--
			}
		}
		switch {
		case t <= j:
			hi = j
		case t >= i:
			lo = i
		default:
			return
		}
	}
}

type bitWriter struct {
	buf []byte
	n   int
}

func (w *bitWriter) write(v uint64, width int) {
	for i := range width {
		if v>>i&1 != 0 {
			w.buf[(w.n+i)/8] |= 1 << ((w.n + i) % 8)
		}
	}
	w.n += width
}

func (w *bitWriter) setBit(i int) { w.buf[i/8] |= 1 << (i % 8) }

func getBit(buf []byte, i int) bool { return buf[i/8]>>(i%8)&1 != 0 }

// readBits reads width bits starting at bit off, least significant first.
func readBits(buf []byte, off, width int) uint32 {
	var v uint32
	for i := range width {
		if getBit(buf, off+i) {
			v |= 1 << i
		}
	}
	return v
}

// validateSparse checks the header fields and sizes of a sparse encoding (not the records).
func (e Encoded) validateSparse() error {
	if err := checkSparseParams(e.BlockSize, e.TopK); err != nil {
		return fmt.Errorf("encoded delta: %w: %w", ErrMalformed, err)
	}
	if e.N < 0 || e.N > maxSparseN {
		return fmt.Errorf("encoded delta: %w: n = %d", ErrMalformed, e.N)
	}
	s := layoutOf(e.N, e.BlockSize, e.TopK)
	if len(e.Scales) != 2*s.blocks {
		return fmt.Errorf("encoded delta: %w: %d scales, want %d (2 per block) for n = %d and block size %d", ErrMalformed, len(e.Scales), 2*s.blocks, e.N, e.BlockSize)
	}
	if len(e.Data) != s.dataLen() {
		return fmt.Errorf("encoded delta: %w: sparse values are %d bytes, want %d", ErrMalformed, len(e.Data), s.dataLen())
	}
	if len(e.Index) != s.indexLen() {
		return fmt.Errorf("encoded delta: %w: sparse index is %d bytes, want %d", ErrMalformed, len(e.Index), s.indexLen())
	}
	for i, v := range e.Scales {
		if !(v >= 0) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("encoded delta: %w: block %d scale %d is %v", ErrMalformed, i/2, i%2, v)
		}
	}
	return nil
}

// sparsePositions decodes and checks block b's positions into pos (length k).
func (e Encoded) sparsePositions(s sparseLayout, b int, pos []uint32) error {
	g := s.geom(b)
	rec := e.Index[s.indexOff(b) : s.indexOff(b)+g.iBytes]
	end := g.k*g.low + g.upper
	j := 0
	for bit := g.k * g.low; bit < end; bit++ {
		if !getBit(rec, bit) {
			continue
		}
		if j == g.k {
			return fmt.Errorf("%w: block %d: index has more than %d positions", ErrMalformed, b, g.k)
		}
		high := uint32(bit - g.k*g.low - j)
		p := high<<g.low | readBits(rec, j*g.low, g.low)
		if int(p) >= g.L {
			return fmt.Errorf("%w: block %d: position %d out of range (block length %d)", ErrMalformed, b, p, g.L)
		}
		if j > 0 && p <= pos[j-1] {
			return fmt.Errorf("%w: block %d: position %d after %d: positions must be strictly increasing", ErrMalformed, b, p, pos[j-1])
		}
		pos[j] = p
		j++
	}
	if j != g.k {
		return fmt.Errorf("%w: block %d: index has %d positions, want %d", ErrMalformed, b, j, g.k)
	}
	for bit := end; bit < 8*g.iBytes; bit++ {
		if getBit(rec, bit) {
			return fmt.Errorf("%w: block %d: index padding bit is set", ErrMalformed, b)
		}
	}
	if pad := 2 * g.k; pad < 8*g.vBytes {
		vrec := e.Data[s.dataOff(b) : s.dataOff(b)+g.vBytes]
		if vrec[len(vrec)-1]>>(pad%8) != 0 {
			return fmt.Errorf("%w: block %d: values padding bit is set", ErrMalformed, b)
		}
	}
	return nil
}

// decodeSparse decodes the blocks [b0, b1) of a validated sparse encoding into dst, which
// holds the values [b0·B, min(b1·B, N)). Every block is checked before dst is written, so on
// error dst is untouched.
func decodeSparse(e Encoded, dst []float32, b0, b1, workers int) error {
	s := layoutOf(e.N, e.BlockSize, e.TopK)
	nb := b1 - b0
	pos := make([]uint32, nb*s.full.k)
	blocksPerChunk := max(1, parallel.ChunkLen/e.BlockSize)
	errs := make([]error, parallel.NumChunks(nb, blocksPerChunk))
	parallel.ForChunks(nb, blocksPerChunk, workers, func(c, lo, hi int) {
		for i := lo; i < hi; i++ {
			g := s.geom(b0 + i)
			if err := e.sparsePositions(s, b0+i, pos[i*s.full.k:i*s.full.k+g.k]); err != nil {
				errs[c] = err
				return
			}
		}
	})
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	base := b0 * e.BlockSize
	parallel.ForChunks(nb, blocksPerChunk, workers, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			b := b0 + i
			g := s.geom(b)
			out := dst[b*e.BlockSize-base : b*e.BlockSize-base+g.L]
			clear(out)
			vrec := e.Data[s.dataOff(b):]
			sLo, sHi := e.Scales[2*b], e.Scales[2*b+1]
			for j, p := range pos[i*s.full.k : i*s.full.k+g.k] {
				code := vrec[j/4] >> (2 * (j % 4)) & 3
				v := sLo
				if code&2 != 0 {
					v = sHi
				}
				if code&1 != 0 {
					v = -v
				}
				out[p] = v
			}
		}
	})
	return nil
}

// sparseSpan is Span for the sparse codec: whole blocks [lo/B, ⌈hi/B⌉).
func (e Encoded) sparseSpan(lo, hi int) (Span, error) {
	if err := checkSparseParams(e.BlockSize, e.TopK); err != nil {
		return Span{}, fmt.Errorf("span: %w: %w", ErrMalformed, err)
	}
	if e.N < 0 || e.N > maxSparseN || lo < 0 || hi < lo || hi > e.N {
		return Span{}, fmt.Errorf("span: %w: range [%d, %d) of %d values", ErrLengthMismatch, lo, hi, e.N)
	}
	B := e.BlockSize
	if lo%B != 0 || (hi%B != 0 && hi != e.N) {
		return Span{}, fmt.Errorf("span: %w: sparse range [%d, %d) must start on a block boundary (block size %d) and end on one or at n = %d", ErrBadConfig, lo, hi, B, e.N)
	}
	s := layoutOf(e.N, B, e.TopK)
	b0, b1 := lo/B, parallel.NumChunks(hi, B)
	sp := Span{Lo: lo, Hi: hi, ScaleBegin: 2 * b0, ScaleEnd: 2 * b1,
		DataBegin: s.dataOff(b0), DataEnd: s.dataOff(b1), IndexBegin: s.indexOff(b0), IndexEnd: s.indexOff(b1)}
	if b1 == s.blocks {
		sp.DataEnd, sp.IndexEnd = s.dataLen(), s.indexLen()
	}
	if lo == hi {
		sp.DataEnd, sp.IndexEnd, sp.ScaleEnd = sp.DataBegin, sp.IndexBegin, sp.ScaleBegin
	}
	return sp, nil
}

// CheckRecords checks every record of a sparse encoding (positions and padding) without
// decoding it, so that a reader that decodes it range by range (DecodeRange, Slice) learns
// before it merges anything whether the whole contribution is well formed. Validate alone
// checks only sizes and scales. For the other codecs it is Validate.
func (e Encoded) CheckRecords(workers int) error {
	if err := e.Validate(); err != nil {
		return err
	}
	if e.Codec != Sparse {
		return nil
	}
	s := layoutOf(e.N, e.BlockSize, e.TopK)
	blocksPerChunk := max(1, parallel.ChunkLen/e.BlockSize)
	errs := make([]error, parallel.NumChunks(s.blocks, blocksPerChunk))
	parallel.ForChunks(s.blocks, blocksPerChunk, workers, func(c, lo, hi int) {
		pos := make([]uint32, s.full.k)
		for b := lo; b < hi; b++ {
			if err := e.sparsePositions(s, b, pos[:s.geom(b).k]); err != nil {
				errs[c] = fmt.Errorf("encoded delta: %w", err)
				return
			}
		}
	})
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// SparseShape is the sparse codec's shape an experiment sets (protocol.sparse_block,
// sparse_topk, sparse_warmup_rounds, sparse_warmup_factor): zero Block and TopK are the
// codec's defaults. Trainers encode with it and validators hold contributions to it.
type SparseShape struct {
	Block, TopK  int
	Warmup       int
	WarmupFactor float64
}

// BlockLen is the block length: Block, or the default.
func (s SparseShape) BlockLen() int {
	if s.Block == 0 {
		return DefaultSparseBlock
	}
	return s.Block
}

// TopKFor is the values per block a window of round keeps, with the warm-up
// (SparseWarmupTopK): the most a contribution to that round may carry.
func (s SparseShape) TopKFor(round uint64) int {
	k := s.TopK
	if k == 0 {
		k = DefaultSparseTopKFor(s.BlockLen())
	}
	return SparseWarmupTopK(k, s.BlockLen(), s.Warmup, s.WarmupFactor, round)
}

// SparseWarmupTopK is the top-k a trainer's window for round (1 = the first) encodes with
// under a top-k warm-up: topK × factor in round 1, falling geometrically to topK by round
// warmup+1 (round r of the first warmup keeps topK × factor^((warmup+1−r)/warmup)), never
// more than block, topK from then on. warmup 0 or factor ≤ 1 is no warm-up. It depends only
// on the settings and the round number, so every trainer and validator computes the same
// value for a round. Early pseudo-gradients are dense: 64 of 4096 values carry about 6 % of
// a first window's energy, and the rest piles up in the error-feedback residual for
// several rounds; a denser start sends it while it is new (docs/diloco-cost.md).
func SparseWarmupTopK(topK, block, warmup int, factor float64, round uint64) int {
	if warmup <= 0 || factor <= 1 || round == 0 || round > uint64(warmup) {
		return topK
	}
	r := int(round)
	k := math.Round(float64(topK) * math.Pow(factor, float64(warmup+1-r)/float64(warmup)))
	return int(min(max(k, float64(topK)), float64(max(block, topK))))
}
