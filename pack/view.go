package pack

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// littleEndian is true on the hosts we support; packs are little-endian on disk, so views
// are only taken when the host agrees.
var littleEndian = func() bool {
	var x uint16 = 1
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// Float32s views b as float32 values without copying when b is 4-byte aligned on a
// little-endian host; otherwise it decodes into a new slice.
func Float32s(b []byte) ([]float32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%w: %d bytes is not a whole number of float32", ErrMalformed, len(b))
	}
	if len(b) == 0 {
		return []float32{}, nil
	}
	if littleEndian && uintptr(unsafe.Pointer(&b[0]))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4), nil
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out, nil
}

// Float32Bytes views v as its little-endian bytes (no copy on little-endian hosts).
func Float32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return []byte{}
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
	}
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], float32bits(x))
	}
	return out
}
