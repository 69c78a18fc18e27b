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

// FuzzDecodeSparse feeds Decode arbitrary sparse encodings: an error or a success, never a
// panic; a success decodes the same bits with 1 and 3 workers, has at most k non-zero
// values per block, each ± one of its block's scales.
func FuzzDecodeSparse(f *testing.F) {
	good, _ := EncodeSparse([]float32{0, 3, 0, 0, 0, -1, 0, 0.5, 2, 0, 0, -4}, nil, 8, 2, 1, 1)
	f.Add(good.N, good.BlockSize, good.TopK, good.Data, scalesBytes(good.Scales), good.Index)
	big, _ := EncodeSparse(randVec(5, 5000), nil, 1024, 16, 1, 1)
	f.Add(big.N, big.BlockSize, big.TopK, big.Data, scalesBytes(big.Scales), big.Index)
	f.Add(1, 1, 1, []byte{0}, []byte{0, 0, 0, 0, 0, 0, 0x80, 0x3f}, []byte{0x02})
	f.Add(-1, 0, 0, []byte{}, []byte{}, []byte{})
	f.Fuzz(func(t *testing.T, n, block, topK int, data, scales, index []byte) {
		e := Encoded{Codec: Sparse, N: n, BlockSize: block, TopK: topK, Data: data, Index: index}
		for i := 0; i+4 <= len(scales); i += 4 {
			e.Scales = append(e.Scales, math.Float32frombits(binary.LittleEndian.Uint32(scales[i:])))
		}
		if n < 0 || n > 1<<20 {
			n = 0
		}
		dst := make([]float32, n)
		if err := Decode(e, dst, 1); err != nil {
			return
		}
		again := make([]float32, n)
		if err := Decode(e, again, 3); err != nil {
			t.Fatalf("second decode failed: %v", err)
		}
		for i := range dst {
			if math.Float32bits(dst[i]) != math.Float32bits(again[i]) {
				t.Fatalf("element %d: %v with 1 worker, %v with 3", i, dst[i], again[i])
			}
		}
		for lo := 0; lo < n; lo += block {
			hi := min(lo+block, n)
			sLo, sHi := e.Scales[2*(lo/block)], e.Scales[2*(lo/block)+1]
			nonZero := 0
			for _, v := range dst[lo:hi] {
				if v != 0 {
					nonZero++
					if m := abs32(v); m != sLo && m != sHi {
						t.Fatalf("block %d: value %v is not ± a scale (%v, %v)", lo/block, v, sLo, sHi)
					}
				}
			}
			if nonZero > topK {
				t.Fatalf("block %d: %d non-zero values, top-k is %d", lo/block, nonZero, topK)
			}
		}
	})
}

// FuzzDecodeRangeSparse: arbitrary sparse encodings and ranges never panic; a range that
// decodes agrees with the full decode whenever every record is well formed (CheckRecords),
// and CheckRecords agrees with Decode.
func FuzzDecodeRangeSparse(f *testing.F) {
	good, _ := EncodeSparse(randVec(9, 1000), nil, 64, 4, 1, 1)
	f.Add(good.N, good.BlockSize, good.TopK, good.Data, scalesBytes(good.Scales), good.Index, 128, 200)
	f.Add(good.N, good.BlockSize, good.TopK, good.Data, scalesBytes(good.Scales), good.Index, 960, 40)
	f.Fuzz(func(t *testing.T, n, block, topK int, data, scales, index []byte, lo, m int) {
		e := Encoded{Codec: Sparse, N: n, BlockSize: block, TopK: topK, Data: data, Index: index}
		for i := 0; i+4 <= len(scales); i += 4 {
			e.Scales = append(e.Scales, math.Float32frombits(binary.LittleEndian.Uint32(scales[i:])))
		}
		if m < 0 || m > 1<<16 {
			m = 0
		}
		dst := make([]float32, m)
		rangeErr := DecodeRange(e, lo, dst, 2)
		if e.N < 0 || e.N > 1<<20 {
			return
		}
		full := make([]float32, e.N)
		fullErr := Decode(e, full, 1)
		if (fullErr == nil) != (e.CheckRecords(2) == nil) {
			t.Fatalf("Decode says %v, CheckRecords disagrees", fullErr)
		}
		if rangeErr != nil || fullErr != nil {
			return
		}
		for i := range dst {
			if math.Float32bits(dst[i]) != math.Float32bits(full[lo+i]) {
				t.Fatalf("element %d: range %v, full %v", lo+i, dst[i], full[lo+i])
			}
		}
	})
}
