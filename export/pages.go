package export

import (
	"os"
	"syscall"
	"unsafe"
)

// hugeBytes is the size of a PMD mapping (x86-64, arm64 with 4 KiB pages).
const hugeBytes = 2 << 20

// pageDropper releases the resident pages of a read-only file mapping m that export walks
// front to back: after a block is compared or written, drop tells the kernel this process
// is done with it, so the resident set stays a few blocks instead of the model (the page
// cache keeps the data, and a later read faults it back in).
//
// The kernel maps a file's large page-cache folios with one PMD entry (2 MiB) where it
// can, and MADV_DONTNEED of only part of such a mapping leaves all of it resident.
// Dropping each 64 KiB block alone therefore releases nothing of a params blob mapped
// that way (docs/design-notes.md). So each drop
// reaches back to the 2 MiB boundary below where the previous one ended: once the walk
// has passed a whole huge mapping, some drop covers all of it.
type pageDropper struct {
	m    []byte
	next int // offset in m where the previous drop ended
}

// drop releases the pages of m up to the end of b, a part of m the caller is done with
// (b outside m, a copy or a header, is ignored). The partial page at b's end is kept, as
// the next block may still need it, unless b ends m.
func (d *pageDropper) drop(b []byte) {
	if d == nil || len(d.m) == 0 || len(b) == 0 {
		return
	}
	base := uintptr(unsafe.Pointer(&d.m[0]))
	lo := uintptr(unsafe.Pointer(&b[0]))
	if lo < base || lo+uintptr(len(b)) > base+uintptr(len(d.m)) {
		return
	}
	off, hi := int(lo-base), int(lo-base)+len(b)
	page := os.Getpagesize()
	end := hi / page * page
	if hi == len(d.m) {
		end = hi // the mapping's last page may be partial: it is ours alone
	}
	start := min(d.next, off) / hugeBytes * hugeBytes
	if end <= start {
		return
	}
	_ = syscall.Madvise(d.m[start:end], syscall.MADV_DONTNEED)
	d.next = end
}
