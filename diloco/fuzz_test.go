package diloco

import (
	"encoding/binary"
	"math"
	"testing"
)

// FuzzDecode feeds Decode arbitrary encodings: it must return an error or succeed, never
// panic or read out of range, and a successful decode must not depend on the worker count.
func FuzzDecode(f *testing.F) {
	good, _ := Encode(Int8, []float32{1, -2, 3, 0.5, 7}, nil, 2, 1)
	f.Add(string(Int8), good.N, good.BlockSize, good.Data, scalesBytes(good.Scales), good.N)
	f.Add(string(FP16), 2, 0, []byte{0x00, 0x3c, 0xff, 0x7b}, []byte{}, 2)
	f.Add(string(FP32), 1, 0, []byte{0, 0, 0x80, 0x3f}, []byte{}, 1)
	f.Add(string(Int8), 3, math.MaxInt, []byte{1, 2, 3}, []byte{0, 0, 0x80, 0x7f}, 3)
	f.Add("int4", -1, -1, []byte{}, []byte{1, 2, 3}, 0)
	f.Fuzz(func(t *testing.T, codec string, n, block int, data, scales []byte, dstLen int) {
		e := Encoded{Codec: Codec(codec), N: n, BlockSize: block, Data: data}
		for i := 0; i+4 <= len(scales); i += 4 {
			e.Scales = append(e.Scales, math.Float32frombits(binary.LittleEndian.Uint32(scales[i:])))
		}
		if dstLen < 0 || dstLen > 1<<20 {
			dstLen = 0
		}
		dst := make([]float32, dstLen)
		if err := Decode(e, dst, 1); err != nil {
			return
		}
		again := make([]float32, dstLen)
		if err := Decode(e, again, 3); err != nil {
			t.Fatalf("second decode failed: %v", err)
		}
		for i := range dst {
			if math.Float32bits(dst[i]) != math.Float32bits(again[i]) {
				t.Fatalf("element %d: %v with 1 worker, %v with 3", i, dst[i], again[i])
			}
		}
	})
}

func scalesBytes(s []float32) []byte {
	b := make([]byte, 4*len(s))
	for i, v := range s {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}
