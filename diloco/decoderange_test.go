package diloco

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// TestDecodeRangeMatchesDecode: every range that starts on a unit boundary decodes to the
// same bits as the full decode, for every codec, including ragged last blocks.
func TestDecodeRangeMatchesDecode(t *testing.T) {
	const n = 3*1024 + 77
	x := randVec(11, n)
	for _, tc := range []struct {
		codec Codec
		block int
	}{{FP32, 0}, {FP16, 0}, {Int8, 256}, {Int8, 100}, {Int8, 1}, {Sparse, 256}, {Sparse, 100}, {Sparse, 1}} {
		t.Run(string(tc.codec), func(t *testing.T) {
			e, err := Encode(tc.codec, x, nil, tc.block, 2)
			if err != nil {
				t.Fatal(err)
			}
			full := make([]float32, n)
			if err := Decode(e, full, 2); err != nil {
				t.Fatal(err)
			}
			a := e.Align()
			for _, r := range [][2]int{{0, n}, {0, 0}, {0, 1}, {a, a + 1}, {2 * a, n}, {n - n%a, n}, {a * 3, a*3 + 5*a}} {
				lo, hi := r[0], min(r[1], n)
				dst := make([]float32, hi-lo)
				if err := DecodeRange(e, lo, dst, 3); err != nil {
					t.Fatalf("[%d, %d): %v", lo, hi, err)
				}
				requireBits32(t, "range", dst, full[lo:hi])
			}
		})
	}
}

// TestSpanViewFromBytes reads a range the way a streaming reader does — span from the
// header fields alone, then only the spanned bytes — and checks it decodes like the full.
func TestSpanViewFromBytes(t *testing.T) {
	const n = 1000
	x := randVec(3, n)
	e, err := Encode(Int8, x, nil, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	full := make([]float32, n)
	if err := Decode(e, full, 1); err != nil {
		t.Fatal(err)
	}
	hdr := Encoded{Codec: e.Codec, N: e.N, BlockSize: e.BlockSize}
	for lo := 0; lo < n; lo += 192 {
		hi := min(lo+192, n)
		s, err := hdr.Span(lo, hi)
		if err != nil {
			t.Fatal(err)
		}
		data := append([]byte(nil), e.Data[s.DataBegin:s.DataEnd]...)
		scales := append([]float32(nil), e.Scales[s.ScaleBegin:s.ScaleEnd]...)
		dst := make([]float32, hi-lo)
		if err := Decode(s.View(hdr, data, scales, nil), dst, 1); err != nil {
			t.Fatal(err)
		}
		requireBits32(t, "view", dst, full[lo:hi])
	}
}

func TestDecodeRangeErrors(t *testing.T) {
	e, err := Encode(Int8, randVec(1, 300), nil, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		e    Encoded
		lo   int
		n    int
		want error
	}{
		{"unaligned", e, 10, 5, ErrBadConfig},
		{"past end", e, 256, 64, ErrLengthMismatch},
		{"negative", e, -64, 5, ErrLengthMismatch},
		{"bad codec", Encoded{Codec: "int4", N: 4}, 0, 1, ErrUnknownCodec},
		{"truncated data", Encoded{Codec: FP32, N: 4, Data: make([]byte, 12)}, 0, 1, ErrMalformed},
		{"missing scales", Encoded{Codec: Int8, N: 4, BlockSize: 2, Data: make([]byte, 4)}, 0, 1, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]float32, tc.n)
			err := DecodeRange(tc.e, tc.lo, dst, 1)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// FuzzDecodeRange: arbitrary encodings and ranges never panic, and a successful range
// decode agrees with the full decode.
func FuzzDecodeRange(f *testing.F) {
	good, _ := Encode(Int8, []float32{1, -2, 3, 0.5, 7}, nil, 2, 1)
	f.Add(string(Int8), good.N, good.BlockSize, good.Data, scalesBytes(good.Scales), 2, 3)
	f.Add(string(FP16), 2, 0, []byte{0x00, 0x3c, 0xff, 0x7b}, []byte{}, 1, 1)
	f.Add(string(FP32), 1, 0, []byte{0, 0, 0x80, 0x3f}, []byte{}, 0, 1)
	f.Add(string(Int8), 3, math.MaxInt, []byte{1, 2, 3}, []byte{0, 0, 0x80, 0x7f}, 0, 3)
	f.Fuzz(func(t *testing.T, codec string, n, block int, data, scales []byte, lo, m int) {
		e := Encoded{Codec: Codec(codec), N: n, BlockSize: block, Data: data}
		for i := 0; i+4 <= len(scales); i += 4 {
			e.Scales = append(e.Scales, math.Float32frombits(binary.LittleEndian.Uint32(scales[i:])))
		}
		if m < 0 || m > 1<<16 {
			m = 0
		}
		dst := make([]float32, m)
		if err := DecodeRange(e, lo, dst, 2); err != nil {
			return
		}
		full := make([]float32, e.N)
		if err := Decode(e, full, 1); err != nil {
			t.Fatalf("range decoded but full decode failed: %v", err)
		}
		for i := range dst {
			if math.Float32bits(dst[i]) != math.Float32bits(full[lo+i]) {
				t.Fatalf("element %d: range %v, full %v", lo+i, dst[i], full[lo+i])
			}
		}
	})
}
