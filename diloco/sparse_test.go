package diloco

import (
	"bytes"
	"cmp"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// A block worked by hand from the layout in sparse.go: n = B = 8, K = 2, so ℓ = ⌊log₂ 4⌋ = 2
// and the upper bitmap has 2 + (7 >> 2) + 1 = 4 bits. Kept: 3 at position 1 and −1 at 5.
// Low parts 01, 01 → bits 0 and 2; upper bits (0>>2)+0 = 0 and (5>>2)+1 = 2 → bits 4 and
// 6: index byte 0b0101_0101. Magnitudes {3, 1} split best as {3} {1}: hi = 3, lo = 1;
// 3 is (+, hi) = code 2, −1 is (−, lo) = code 1 → value byte 2 | 1<<2 = 0x06.
func TestEncodeSparseByHand(t *testing.T) {
	delta := []float32{0, 3, 0, 0, 0, -1, 0, 0.5}
	residual := make([]float32, len(delta))
	e, err := EncodeSparse(delta, residual, 8, 2, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(e.Index, []byte{0x55}) || !bytes.Equal(e.Data, []byte{0x06}) || !slices.Equal(e.Scales, []float32{1, 3}) {
		t.Fatalf("index % x data % x scales %v, want 55, 06, [1 3]", e.Index, e.Data, e.Scales)
	}
	if e.WireBytes() != 1+1+8 {
		t.Fatalf("WireBytes = %d, want 10", e.WireBytes())
	}
	requireBits32(t, "residual", residual, []float32{0, 0, 0, 0, 0, 0, 0, 0.5})
	dec := make([]float32, len(delta))
	if err := Decode(e, dec, 1); err != nil {
		t.Fatal(err)
	}
	requireBits32(t, "decoded", dec, []float32{0, 3, 0, 0, 0, -1, 0, 0})
}

// Properties over sizes, block sizes and top-k: per block exactly the k largest magnitudes
// are kept (ties to the lower position) and decode as ±one of the block's two scales with
// the value's sign; everything else decodes as 0; residual = x − decoded, exact for values
// not kept; the payload size is the layout's.
func TestEncodeSparseProperties(t *testing.T) {
	tests := []struct{ n, block, topK int }{
		{1, 1, 1}, {5, 4, 4}, {7, 3, 2}, {100, 16, 3}, {4096, 4096, 64}, {10000, 4096, 64},
		{65537, 512, 8}, {9000, 1000, 1000},
	}
	for _, tc := range tests {
		delta := randVec(uint64(tc.n*31+tc.block), tc.n)
		before := randVec(uint64(tc.n+5), tc.n)
		for i := range before {
			before[i] *= 0.25
		}
		residual := slices.Clone(before)
		e, err := EncodeSparse(delta, residual, tc.block, tc.topK, 1, 2)
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		if e.WireBytes() != SparseWireBytes(tc.n, tc.block, tc.topK) {
			t.Fatalf("%+v: WireBytes %d, SparseWireBytes %d", tc, e.WireBytes(), SparseWireBytes(tc.n, tc.block, tc.topK))
		}
		dec := make([]float32, tc.n)
		if err := Decode(e, dec, 3); err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		for lo := 0; lo < tc.n; lo += tc.block {
			hi := min(lo+tc.block, tc.n)
			x := make([]float32, hi-lo)
			for i := range x {
				x[i] = delta[lo+i] + before[lo+i]
			}
			order := make([]int, len(x))
			for i := range order {
				order[i] = i
			}
			slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(abs32(x[b]), abs32(x[a])) })
			k := min(tc.topK, len(x))
			kept := map[int]bool{}
			for _, i := range order[:k] {
				kept[i] = true
			}
			sLo, sHi := e.Scales[2*(lo/tc.block)], e.Scales[2*(lo/tc.block)+1]
			for i, xi := range x {
				d, r := dec[lo+i], residual[lo+i]
				if !kept[i] {
					if d != 0 || math.Float32bits(r) != math.Float32bits(xi) {
						t.Fatalf("%+v: element %d not kept: decoded %v residual %v, want 0 and %v", tc, lo+i, d, r, xi)
					}
					continue
				}
				if m := abs32(d); m != sLo && m != sHi {
					t.Fatalf("%+v: element %d decoded %v, scales %v %v", tc, lo+i, d, sLo, sHi)
				}
				if d != 0 && math.Signbit(float64(d)) != math.Signbit(float64(xi)) {
					t.Fatalf("%+v: element %d decoded %v for %v", tc, lo+i, d, xi)
				}
				if math.Float32bits(r) != math.Float32bits(xi-d) {
					t.Fatalf("%+v: element %d residual %v, want %v − %v", tc, lo+i, r, xi, d)
				}
			}
		}
	}
}

// The figure of the issue: at the defaults the payload is ≤ 1 % of the fp32 bytes (0.537 %:
// per 4096-value block 48 B of low bits + 16 B of upper bitmap + 16 B of values + 8 B of
// scales; a short last block costs a little more).
func TestSparseSizeAtDefaults(t *testing.T) {
	for _, n := range []int{4096, 300_000, 10_000_000, 1 << 30} {
		got := float64(SparseWireBytes(n, DefaultSparseBlock, DefaultSparseTopK)) / (4 * float64(n))
		if got > 0.0055 {
			t.Errorf("n = %d: sparse payload is %.4f %% of fp32, want ≤ 0.55 %%", n, 100*got)
		}
	}
	if got := SparseWireBytes(4096, 4096, 64); got != 88 {
		t.Fatalf("one default block is %d bytes, want 88", got)
	}
}

func TestSparseDeterministicAcrossWorkers(t *testing.T) {
	delta := randVec(11, 300001)
	var ref Encoded
	var refRes, refDec []float32
	for _, w := range workerCounts {
		res := randVec(12, len(delta))
		e, err := EncodeSparse(delta, res, 1024, 16, 1, w)
		if err != nil {
			t.Fatal(err)
		}
		dec := make([]float32, len(delta))
		if err := Decode(e, dec, w); err != nil {
			t.Fatal(err)
		}
		if ref.N == 0 {
			ref, refRes, refDec = e, res, dec
			continue
		}
		if !bytes.Equal(e.Data, ref.Data) || !bytes.Equal(e.Index, ref.Index) || !slices.Equal(e.Scales, ref.Scales) {
			t.Fatalf("workers %d: encoding differs", w)
		}
		requireBits32(t, "residual", res, refRes)
		requireBits32(t, "decoded", dec, refDec)
	}
}

// Error feedback: what was not sent is sent later. With a steady signal spread over every
// coordinate (so that top-k alone would only ever send the same few), the decoded sum over
// many rounds tracks the true sum; without feedback most of the signal never arrives. The
// gap is exactly the residual, up to float32 rounding.
func TestSparseErrorFeedbackTracksTrueSum(t *testing.T) {
	const (
		n, block, topK = 4096, 256, 8
		rounds         = 300
	)
	rng := rand.New(rand.NewPCG(3, 3))
	drift := make([]float32, n)
	for i := range drift {
		drift[i] = float32(0.5 + rng.Float64()) // every coordinate has its own steady drift
	}
	trueSum := make([]float64, n)
	sentEF := make([]float64, n)
	sentPlain := make([]float64, n)
	residual := make([]float32, n)
	delta := make([]float32, n)
	dec := make([]float32, n)
	for range rounds {
		for i := range delta {
			delta[i] = drift[i] + float32(0.1*rng.NormFloat64())
			trueSum[i] += float64(delta[i])
		}
		for _, ef := range []bool{true, false} {
			var r []float32
			if ef {
				r = residual
			}
			e, err := EncodeSparse(delta, r, block, topK, 1, 2)
			if err != nil {
				t.Fatal(err)
			}
			if err := Decode(e, dec, 2); err != nil {
				t.Fatal(err)
			}
			for i, v := range dec {
				if ef {
					sentEF[i] += float64(v)
				} else {
					sentPlain[i] += float64(v)
				}
			}
		}
	}
	var gapEF, gapPlain, norm, identity float64
	for i := range trueSum {
		gapEF += (trueSum[i] - sentEF[i]) * (trueSum[i] - sentEF[i])
		gapPlain += (trueSum[i] - sentPlain[i]) * (trueSum[i] - sentPlain[i])
		norm += trueSum[i] * trueSum[i]
		identity = max(identity, math.Abs(trueSum[i]-sentEF[i]-float64(residual[i])))
	}
	relEF, relPlain := math.Sqrt(gapEF/norm), math.Sqrt(gapPlain/norm)
	if relEF > 0.15 || relPlain < 0.8 {
		t.Fatalf("relative gap to the true sum: %.3f with feedback (want ≤ 0.15), %.3f without (want ≥ 0.8)", relEF, relPlain)
	}
	if identity > 1e-2 {
		t.Fatalf("true sum − sent differs from the residual by up to %g", identity)
	}
}

// mutate returns a fresh, valid encoding of a fixed vector for the bad-input table.
func sparseFixture(t *testing.T) Encoded {
	t.Helper()
	delta := []float32{0, 3, 0, 0, 0, -1, 0, 0.5, 2, 0, 0, -4}
	e, err := EncodeSparse(delta, nil, 8, 2, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	e.Data, e.Index, e.Scales = slices.Clone(e.Data), slices.Clone(e.Index), slices.Clone(e.Scales)
	return e
}

func TestDecodeSparseRejects(t *testing.T) {
	// Block 0 is the hand-worked block (index 0x55: positions 1 and 5). Block 1 holds 4
	// values, k = 2, ℓ = 1, upper bitmap 2 + 1 + 1 = 4 bits, 6 bits in one byte.
	tests := []struct {
		name   string
		mutate func(*Encoded)
		want   string
	}{
		{"positions out of order", func(e *Encoded) { e.Index[0] = 0b0011_0011 }, "strictly increasing"}, // lows 3, 0; highs 0, 0 → 3, 0
		{"duplicate position", func(e *Encoded) { e.Index[0] = 0b0101_0101&^0b0100_0000 | 0b0010_0000 }, "strictly increasing"},
		{"position out of range", func(e *Encoded) { e.Index[1] = 0b0010_0111 }, "out of range"}, // block 1: lows 1,1; highs 0 and 2 → 1, 5 ≥ 4
		{"too many positions", func(e *Encoded) { e.Index[0] |= 0b1000_0000 }, "more than 2"},
		{"too few positions", func(e *Encoded) { e.Index[0] &^= 0b0100_0000 }, "has 1 positions"},
		{"index padding", func(e *Encoded) { e.Index[1] |= 0b1000_0000 }, "padding"},
		{"values padding", func(e *Encoded) { e.Data[0] |= 0b1000_0000 }, "padding"},
		{"NaN scale", func(e *Encoded) { e.Scales[1] = float32(math.NaN()) }, "scale 1 is NaN"},
		{"negative scale", func(e *Encoded) { e.Scales[2] = -1 }, "block 1 scale 0"},
		{"infinite scale", func(e *Encoded) { e.Scales[3] = float32(math.Inf(1)) }, "+Inf"},
		{"block count disagrees: scales", func(e *Encoded) { e.Scales = e.Scales[:2] }, "2 scales, want 4"},
		{"block count disagrees: n", func(e *Encoded) { e.N = 20 }, "4 scales, want 6"},
		{"index length", func(e *Encoded) { e.Index = e.Index[:1] }, "index is 1 bytes"},
		{"top-k above block", func(e *Encoded) { e.TopK = 9 }, "top-k 9"},
		{"zero block size", func(e *Encoded) { e.BlockSize = 0 }, "block size 0"},
		{"huge block size", func(e *Encoded) { e.BlockSize = math.MaxInt }, "block size"},
		{"negative n", func(e *Encoded) { e.N = -1 }, "n = -1"},
		{"index on a dense codec", func(e *Encoded) { e.Codec = FP32; e.Data = make([]byte, 48) }, "top-k 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := sparseFixture(t)
			tc.mutate(&e)
			dst := make([]float32, max(e.N, 0))
			for i := range dst {
				dst[i] = 42
			}
			err := Decode(e, dst, 2)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want ErrMalformed", err)
			}
			if !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
			for i, v := range dst {
				if v != 42 {
					t.Fatalf("dst[%d] written on error", i)
				}
			}
		})
	}
	// The fixture itself decodes.
	e := sparseFixture(t)
	dst := make([]float32, e.N)
	if err := Decode(e, dst, 1); err != nil {
		t.Fatal(err)
	}
}

func TestEncodeSparseErrors(t *testing.T) {
	tests := []struct {
		name        string
		delta, res  []float32
		block, topK int
		decay       float64 // 0: 1
		want        error
	}{
		{"top-k above block", []float32{1, 2}, nil, 2, 3, 0, ErrBadConfig},
		{"negative block", []float32{1}, nil, -1, 1, 0, ErrBadConfig},
		{"residual length", []float32{1, 2}, []float32{1}, 2, 1, 0, ErrLengthMismatch},
		{"NaN", []float32{1, float32(math.NaN())}, nil, 2, 1, 0, ErrNonFinite},
		{"overflowing sum", []float32{3e38}, []float32{3e38}, 1, 1, 0, ErrNonFinite},
		{"overflowing decayed sum", []float32{3e38}, []float32{3e38}, 1, 1, 0.95, ErrNonFinite},
		{"decay above 1", []float32{1}, []float32{1}, 1, 1, 1.01, ErrBadConfig},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var res []float32
			if tc.res != nil {
				res = slices.Clone(tc.res)
			}
			decay := cmp.Or(tc.decay, 1)
			if _, err := EncodeSparse(tc.delta, res, tc.block, tc.topK, decay, 1); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if !slices.Equal(res, tc.res) {
				t.Fatalf("residual changed on error")
			}
		})
	}
	// The check is on the value encoded: 3e38 + 1e38 overflows, 3e38 + 0.1 × 1e38 does not.
	res := []float32{1e38}
	if _, err := EncodeSparse([]float32{3e38}, res, 1, 1, 0.1, 1); err != nil {
		t.Fatalf("decayed sum 3.1e38: %v", err)
	}
	if res[0] != 0 {
		t.Fatalf("decayed sum 3.1e38, sent whole: residual %v, want 0", res[0])
	}
	// Encode(Sparse) is EncodeSparse at the default top-k ratio.
	e, err := Encode(Sparse, make([]float32, 10000), nil, 0, 1)
	if err != nil || e.BlockSize != DefaultSparseBlock || e.TopK != DefaultSparseTopK {
		t.Fatalf("Encode(Sparse): %+v, %v", e, err)
	}
}

func TestSelectLargest(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 3, 10, 100, 4096} {
		for _, k := range []int{1, 2, n / 2, n} {
			if k < 1 || k > n {
				continue
			}
			keys := make([]uint64, n)
			for i := range keys {
				keys[i] = uint64(rng.IntN(8))<<32 | uint64(i) // many equal high parts
			}
			want := slices.Clone(keys)
			slices.Sort(want)
			want = want[n-k:]
			selectLargest(keys, k)
			got := slices.Clone(keys[:k])
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("n %d k %d: got %v, want %v", n, k, got, want)
			}
		}
	}
}

// A streaming reader's way through a sparse file: Span from the header fields alone, then
// only the spanned bytes of the three tensors, decoded like the full encoding; CheckRecords
// first to know the whole contribution is well formed.
func TestSparseSpanViewFromBytes(t *testing.T) {
	const n = 1000
	e, err := EncodeSparse(randVec(3, n), nil, 64, 4, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.CheckRecords(2); err != nil {
		t.Fatal(err)
	}
	full := make([]float32, n)
	if err := Decode(e, full, 1); err != nil {
		t.Fatal(err)
	}
	hdr := Encoded{Codec: e.Codec, N: e.N, BlockSize: e.BlockSize, TopK: e.TopK}
	if hdr.Align() != 64 {
		t.Fatalf("Align = %d", hdr.Align())
	}
	for lo := 0; lo < n; lo += 192 {
		hi := min(lo+192, n)
		s, err := hdr.Span(lo, hi)
		if err != nil {
			t.Fatal(err)
		}
		data := append([]byte(nil), e.Data[s.DataBegin:s.DataEnd]...)
		index := append([]byte(nil), e.Index[s.IndexBegin:s.IndexEnd]...)
		scales := append([]float32(nil), e.Scales[s.ScaleBegin:s.ScaleEnd]...)
		dst := make([]float32, hi-lo)
		if err := Decode(s.View(hdr, data, scales, index), dst, 1); err != nil {
			t.Fatal(err)
		}
		requireBits32(t, "view", dst, full[lo:hi])
	}
	for _, r := range [][2]int{{10, 64}, {0, 100}, {64, 1001}} {
		if _, err := hdr.Span(r[0], r[1]); err == nil {
			t.Errorf("Span(%d, %d) of a sparse encoding: no error", r[0], r[1])
		}
	}
	// A bad record in a block outside the range: the range decodes, CheckRecords objects.
	bad := e
	bad.Index = slices.Clone(e.Index)
	bad.Index[len(bad.Index)-1] ^= 0xff
	if err := DecodeRange(bad, 0, make([]float32, 64), 1); err != nil {
		t.Fatalf("range before the bad block: %v", err)
	}
	if err := bad.CheckRecords(2); !errors.Is(err, ErrMalformed) {
		t.Fatalf("CheckRecords = %v, want ErrMalformed", err)
	}
}

// The warm-up's top-k: topK × factor in round 1, geometric down to topK at round warmup+1,
// capped at the block, and no warm-up when it is off or past.
func TestSparseWarmupTopK(t *testing.T) {
	cases := []struct {
		name                string
		topK, block, warmup int
		factor              float64
		round               uint64
		want                int
	}{
		{"off", 64, 4096, 0, 16, 1, 64},
		{"factor 1", 64, 4096, 4, 1, 1, 64},
		{"round 1", 64, 4096, 4, 16, 1, 1024},
		{"round 2", 64, 4096, 4, 16, 2, 512},
		{"round 3", 64, 4096, 4, 16, 3, 256},
		{"round 4", 64, 4096, 4, 16, 4, 128},
		{"past the warm-up", 64, 4096, 4, 16, 5, 64},
		{"far past", 64, 4096, 4, 16, 1 << 40, 64},
		{"round 0", 64, 4096, 4, 16, 0, 64},
		{"capped at the block", 64, 256, 2, 16, 1, 256},
		{"one round", 2, 64, 1, 3, 1, 6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := SparseWarmupTopK(tc.topK, tc.block, tc.warmup, tc.factor, tc.round)
			if got != tc.want {
				t.Fatalf("SparseWarmupTopK(%d, %d, %d, %v, %d) = %d, want %d", tc.topK, tc.block, tc.warmup, tc.factor, tc.round, got, tc.want)
			}
			if err := checkSparseParams(tc.block, got); err != nil {
				t.Fatal(err)
			}
		})
	}
}
