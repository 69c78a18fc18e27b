package diloco

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/p2pnode/p2pnode/codecs"
)

func TestEncodeFP32(t *testing.T) {
	e, err := Encode(FP32, []float32{1, -2, negZero()}, nil, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0, 0x00, 0x00, 0x00, 0x80}
	if !bytes.Equal(e.Data, want) || e.N != 3 || e.BlockSize != 0 || e.Scales != nil {
		t.Fatalf("got %+v, want data % x", e, want)
	}
	if e.WireBytes() != 12 {
		t.Fatalf("WireBytes = %d", e.WireBytes())
	}
}

func TestEncodeFP16(t *testing.T) {
	tests := []struct {
		name string
		in   float32
		want uint16
	}{
		{"one", 1, 0x3c00},
		{"minus two", -2, 0xc000},
		{"negative zero", negZero(), 0x8000},
		{"max half", 65504, 0x7bff},
		{"rounds to nearest even", 0.1, 0x2e66},
		{"tie to even stays", 2049, 0x6800},     // 2049 is half way between 2048 and 2050
		{"tie to even rounds up", 2051, 0x6802}, // between 2050 (odd) and 2052 (even)
		{"smallest subnormal", 0x1p-24, 0x0001},
		{"underflow to zero", 1e-9, 0x0000},
		{"just past max saturates", 65520, 0x7bff},
		{"overflow saturates", 1e6, 0x7bff},
		{"negative overflow saturates", -3e38, 0xfbff},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Encode(FP16, []float32{tc.in}, nil, 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			if got := uint16(e.Data[0]) | uint16(e.Data[1])<<8; got != tc.want {
				t.Fatalf("half bits %#04x, want %#04x", got, tc.want)
			}
		})
	}
}

func TestEncodeInt8(t *testing.T) {
	// Block 0 has max 127, so scale 1 and the rounding is visible: −63.5 → −64, 0.5 → 1
	// and 2.5 → 3 (half away from zero, not to even). Block 1 is all zeros: scale 0.
	// Block 2 is short, max 254: scale 2, −254 → −127, 1/2 = 0.5 → 1.
	delta := []float32{127, -63.5, 0.5, 2.5, 0, 0, negZero(), 0, -254, 1}
	residual := make([]float32, len(delta))
	e, err := Encode(Int8, delta, residual, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	wantData := []byte{0x7f, 0xc0, 0x01, 0x03, 0, 0, 0, 0, 0x81, 0x01}
	if !bytes.Equal(e.Data, wantData) {
		t.Fatalf("data % x, want % x", e.Data, wantData)
	}
	if !slices.Equal(e.Scales, []float32{1, 0, 2}) || e.BlockSize != 4 || e.N != 10 {
		t.Fatalf("encoded %+v", e)
	}
	if e.WireBytes() != 10+12 {
		t.Fatalf("WireBytes = %d", e.WireBytes())
	}
	requireBits32(t, "residual", residual, []float32{0, 0.5, -0.5, -0.5, 0, 0, 0, 0, 0, -1})

	got := make([]float32, len(delta))
	if err := Decode(e, got, 1); err != nil {
		t.Fatal(err)
	}
	requireBits32(t, "decoded", got, []float32{127, -64, 1, 3, 0, 0, 0, 0, -254, 2})

	// With error feedback the next round encodes delta + residual.
	e2, err := Encode(Int8, make([]float32, len(delta)), residual, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(e2.Scales, []float32{0.5 / 127, 0, 1. / 127}) {
		t.Fatalf("second round scales %v", e2.Scales)
	}
}

func TestEncodeInt8DefaultBlock(t *testing.T) {
	e, err := Encode(Int8, make([]float32, 1000), nil, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if e.BlockSize != DefaultBlockSize || len(e.Scales) != 4 {
		t.Fatalf("block size %d, %d scales", e.BlockSize, len(e.Scales))
	}
}

func TestQuantize(t *testing.T) {
	tests := []struct {
		x, scale float32
		want     int8
	}{
		{2.5, 1, 3},
		{-2.5, 1, -3},
		{0.49999997, 1, 0},
		{-0.5, 1, -1},
		{200, 1, 127},
		{-200, 1, -127},
		{1, 0, 0},
		{1e30, 1e-30, 127}, // the quotient overflows to +Inf
		{-1e30, 1e-30, -127},
	}
	for _, tc := range tests {
		if got := quantize(tc.x, tc.scale); got != tc.want {
			t.Errorf("quantize(%v, %v) = %d, want %d", tc.x, tc.scale, got, tc.want)
		}
	}
	// A subnormal scale can round down so far that max|x|/scale passes 127.5; the clamp
	// keeps the largest value at 127.
	x := float32(190 * 0x1p-149)
	s := int8Scale(x)
	if s != 0x1p-149 || quantize(x, s) != 127 {
		t.Errorf("subnormal block: scale %v, q %d", s, quantize(x, s))
	}
}

func TestRoundTrip(t *testing.T) {
	x := randVec(42, 3000)
	for _, c := range codecs.All() {
		t.Run(string(c), func(t *testing.T) {
			r := make([]float32, len(x))
			e, err := Encode(c, x, r, 64, 2)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Validate(); err != nil {
				t.Fatal(err)
			}
			got := make([]float32, len(x))
			if err := Decode(e, got, 2); err != nil {
				t.Fatal(err)
			}
			// decoded + residual gives back x: what the codec dropped is only deferred. For
			// the dense codecs exactly (the decoded value is within a factor 2 of x, so
			// x − decoded is exact); a sparse value decodes as a block scale that can be far
			// from x, so x − decoded is rounded once: within half an ulp of the larger.
			for i := range x {
				if c == Sparse {
					tol := 0x1p-24 * float64(max(abs32(x[i]), abs32(got[i])))
					if math.Abs(float64(got[i])+float64(r[i])-float64(x[i])) > tol {
						t.Fatalf("element %d: decoded %v + residual %v != %v", i, got[i], r[i], x[i])
					}
					continue
				}
				if got[i]+r[i] != x[i] {
					t.Fatalf("element %d: decoded %v + residual %v != %v", i, got[i], r[i], x[i])
				}
			}
			if c == FP32 {
				// Without a residual fp32 is bit-exact, signed zeros included (with one,
				// x = delta + 0 turns −0 into +0).
				e, err := Encode(FP32, x, nil, 0, 2)
				if err != nil {
					t.Fatal(err)
				}
				if err := Decode(e, got, 2); err != nil {
					t.Fatal(err)
				}
				requireBits32(t, "fp32 exact", got, x)
			}
		})
	}
}

func TestEncodeErrors(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	tests := []struct {
		name            string
		codec           Codec
		delta, residual []float32
		block           int
		want            error
	}{
		{"unknown codec", "int4", []float32{1}, nil, 0, ErrUnknownCodec},
		{"short residual", Int8, []float32{1, 2}, []float32{0}, 0, ErrLengthMismatch},
		{"negative block", Int8, []float32{1}, nil, -1, ErrBadConfig},
		{"NaN", FP16, []float32{1, nan}, nil, 0, ErrNonFinite},
		{"Inf", Int8, []float32{inf}, nil, 0, ErrNonFinite},
		{"overflowing sum", FP32, []float32{3e38}, []float32{3e38}, 0, ErrNonFinite},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(tc.residual)
			if _, err := Encode(tc.codec, tc.delta, tc.residual, tc.block, 0); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if !slices.Equal(before, tc.residual) {
				t.Fatalf("residual changed on error: %v → %v", before, tc.residual)
			}
		})
	}
}

func TestDecodeValidation(t *testing.T) {
	ok := Encoded{Codec: Int8, N: 5, BlockSize: 2, Data: make([]byte, 5), Scales: []float32{1, 1, 1}}
	with := func(f func(*Encoded)) Encoded {
		e := ok
		e.Scales = slices.Clone(ok.Scales)
		f(&e)
		return e
	}
	tests := []struct {
		name string
		e    Encoded
		dst  int
		want error
	}{
		{"valid", ok, 5, nil},
		{"unknown codec", with(func(e *Encoded) { e.Codec = "bf16" }), 5, ErrUnknownCodec},
		{"negative n", with(func(e *Encoded) { e.N = -1 }), 5, ErrMalformed},
		{"huge n", with(func(e *Encoded) { e.N = math.MaxInt }), 5, ErrMalformed},
		{"short data", with(func(e *Encoded) { e.Data = e.Data[:4] }), 5, ErrMalformed},
		{"zero block", with(func(e *Encoded) { e.BlockSize = 0 }), 5, ErrMalformed},
		{"missing scale", with(func(e *Encoded) { e.Scales = e.Scales[:2] }), 5, ErrMalformed},
		{"extra scale", with(func(e *Encoded) { e.Scales = append(e.Scales, 1) }), 5, ErrMalformed},
		{"NaN scale", with(func(e *Encoded) { e.Scales[1] = float32(math.NaN()) }), 5, ErrMalformed},
		{"Inf scale", with(func(e *Encoded) { e.Scales[2] = float32(math.Inf(1)) }), 5, ErrMalformed},
		{"negative scale", with(func(e *Encoded) { e.Scales[0] = -1 }), 5, ErrMalformed},
		{"dst too short", ok, 4, ErrLengthMismatch},
		{"fp16 odd data", Encoded{Codec: FP16, N: 2, Data: make([]byte, 3)}, 2, ErrMalformed},
		{"fp32 with scales", Encoded{Codec: FP32, N: 1, Data: make([]byte, 4), Scales: []float32{1}}, 1, ErrMalformed},
		{"fp16 with block size", Encoded{Codec: FP16, N: 1, BlockSize: 8, Data: make([]byte, 2)}, 1, ErrMalformed},
		{"empty int8", Encoded{Codec: Int8, BlockSize: 256}, 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]float32, tc.dst)
			for i := range dst {
				dst[i] = 42
			}
			err := Decode(tc.e, dst, 0)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if err != nil && slices.ContainsFunc(dst, func(v float32) bool { return v != 42 }) {
				t.Fatal("dst written on error")
			}
		})
	}
}

func TestDecodeFP16NonFinite(t *testing.T) {
	// Inf and NaN halves are not produced by Encode but are decoded faithfully so that
	// screening (not the codec) rejects the contribution.
	e := Encoded{Codec: FP16, N: 2, Data: []byte{0x00, 0x7c, 0x00, 0x7e}}
	dst := make([]float32, 2)
	if err := Decode(e, dst, 1); err != nil {
		t.Fatal(err)
	}
	if !math.IsInf(float64(dst[0]), 1) || !math.IsNaN(float64(dst[1])) {
		t.Fatalf("decoded %v", dst)
	}
}

// quantize's fast rounding must agree with math.Round for every quotient: sweep all float32
// values in [−128, 128] at a stride, plus every half-integer tie and its neighbours.
func TestQuantizeMatchesMathRound(t *testing.T) {
	ref := func(v float32) int8 {
		return int8(max(-127, min(127, math.Round(float64(v)))))
	}
	check := func(v float32) {
		if got, want := quantize(v, 1), ref(v); got != want {
			t.Fatalf("quantize(%v) = %d, want %d", v, got, want)
		}
	}
	for b := uint32(0); b <= math.Float32bits(128); b += 997 {
		v := math.Float32frombits(b)
		check(v)
		check(-v)
	}
	for k := -128; k <= 128; k++ {
		tie := float32(k) + 0.5
		check(tie)
		check(math.Nextafter32(tie, 0))
		check(math.Nextafter32(tie, 200))
		check(math.Nextafter32(tie, -200))
	}
}
