package export

import (
	"os"
	"syscall"
	"unsafe"
)

// dropPages tells the kernel this process is done with b, a part of the read-only file
// mapping m: its whole pages leave the resident set (the page cache keeps the data, and a
// later read faults it back in). Export walks multi-GB mappings front to back; dropping
// what it has passed keeps its resident set to a few blocks instead of the model. b outside
// m (a copy, a header) is ignored, as are the partial pages at b's ends.
func dropPages(m, b []byte) {
	if len(m) == 0 || len(b) == 0 {
		return
	}
	base := uintptr(unsafe.Pointer(&m[0]))
	lo := uintptr(unsafe.Pointer(&b[0]))
	hi := lo + uintptr(len(b))
	if lo < base || hi > base+uintptr(len(m)) {
		return
	}
	page := uintptr(os.Getpagesize())
	start := (lo - base + page - 1) / page * page
	end := (hi - base) / page * page
	if hi == base+uintptr(len(m)) {
		end = uintptr(len(m)) // the mapping's last page may be partial: it is ours alone
	}
	if end <= start {
		return
	}
	_ = syscall.Madvise(m[start:end], syscall.MADV_DONTNEED)
}
