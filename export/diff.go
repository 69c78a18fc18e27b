package export

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"syscall"
)

// fileDiff is the outcome of comparing one file on disk with its planned content.
type fileDiff struct {
	blocks   []int64 // offsets of the blocks that differ, ascending
	compared int64
	changed  int64
	// rewrite: more than half of the file differs, so it is written whole (journaling
	// writes every changed byte twice: past half the file a rewrite writes less). The
	// comparison stops there, which spares reading the rest when everything changed (a
	// DiLoCo outer step moves every parameter).
	rewrite bool
}

// diffFile maps the file at path read-only and compares it with the planned file block by
// block (blocks aligned to file offsets, the last one shorter). The caller has checked
// that the file has the planned size.
//
// Both mappings are walked once, front to back; drop releases each block of src once
// compared (and the old file's pages go the same way), so the resident set stays a few
// blocks whatever the model size.
func diffFile(ctx context.Context, path string, fp *filePlan, src []byte, block int, drop func([]byte)) (d *fileDiff, err error) {
	// A file truncated by someone else while mapped faults on access: make that an error
	// naming the file instead of a crash.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if _, fault := r.(interface{ Addr() uintptr }); !fault {
			panic(r) // a bug, not a fault on the mapping
		}
		d, err = nil, fmt.Errorf("compare %s: the file changed while it was read: %v", path, r)
	}()
	size := fp.size()
	d = &fileDiff{}
	if size == 0 {
		return d, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	old, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	defer syscall.Munmap(old)
	oldPages := &pageDropper{m: old}
	// We read the whole file once, front to back: ask for read-ahead.
	_ = syscall.Madvise(old, syscall.MADV_SEQUENTIAL)
	buf := make([]byte, block)
	for off := int64(0); off < size; off += int64(block) {
		if off%(256*int64(block)) == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("compare %s: %w", path, ctx.Err())
		}
		n := int(min(int64(block), size-off))
		d.compared += int64(n)
		want := fp.at(src, off, n, buf)
		same := bytes.Equal(old[off:off+int64(n)], want)
		oldPages.drop(old[off : off+int64(n)])
		if drop != nil {
			drop(want)
		}
		if !same {
			d.blocks = append(d.blocks, off)
			d.changed += int64(n)
			if 2*d.changed > size {
				d.rewrite, d.blocks = true, nil
				return d, nil
			}
		}
	}
	return d, nil
}
