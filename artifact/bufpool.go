package artifact

import (
	"sync"
	"unsafe"
)

// directIOAlign is the alignment O_DIRECT needs of buffers, offsets and lengths on the
// file systems we expect (4 KiB logical blocks or smaller).
const directIOAlign = 4096

// bufPool hands out byte slices of a few exact sizes (chunk sizes and the holder's read
// piece), so that a transfer reuses a handful of chunk-sized buffers instead of
// allocating one per chunk. Buffers start on a directIOAlign boundary so that chunks can
// be written with O_DIRECT straight from them.
type bufPool struct {
	mu    sync.Mutex
	pools map[int]*sync.Pool
}

var buffers = bufPool{pools: make(map[int]*sync.Pool)}

func (bp *bufPool) pool(n int) *sync.Pool {
	bp.mu.Lock()
	defer bp.mu.Unlock()
	p := bp.pools[n]
	if p == nil {
		p = &sync.Pool{New: func() any {
			raw := make([]byte, n+directIOAlign)
			off := 0
			if r := int(uintptr(unsafe.Pointer(unsafe.SliceData(raw))) % directIOAlign); r != 0 {
				off = directIOAlign - r
			}
			b := raw[off : off+n : off+n]
			return &b
		}}
		bp.pools[n] = p
	}
	return p
}

// get returns a buffer of exactly n bytes (contents undefined).
func (bp *bufPool) get(n int) *[]byte { return bp.pool(n).Get().(*[]byte) }

// put returns a buffer obtained from get.
func (bp *bufPool) put(b *[]byte) { bp.pool(len(*b)).Put(b) }

// directIOAligned reports whether b can be written with O_DIRECT at off.
func directIOAligned(b []byte, off int64) bool {
	return len(b) > 0 && len(b)%directIOAlign == 0 && off%directIOAlign == 0 &&
		uintptr(unsafe.Pointer(unsafe.SliceData(b)))%directIOAlign == 0
}
