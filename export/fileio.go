package export

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// ioCounter counts the bytes one export writes (temp files, journal, blocks), which is
// what the report and the benchmark call "written". Tests give it a limit to simulate a
// full disk at any byte. One export uses it from one goroutine.
type ioCounter struct {
	written int64
	limit   int64 // writes past this many bytes fail with ENOSPC; < 0: no limit
}

func newCounter(f *faults) *ioCounter {
	c := &ioCounter{limit: -1}
	if f != nil && f.diskBytes > 0 {
		c.limit = f.diskBytes
	}
	return c
}

// allow returns how many of n bytes may be written before the simulated disk is full.
func (c *ioCounter) allow(n int) (int, error) {
	if c.limit < 0 || c.written+int64(n) <= c.limit {
		return n, nil
	}
	return int(max(0, c.limit-c.written)), syscall.ENOSPC
}

// countedFile is an *os.File whose writes are counted (and can be made to fail).
type countedFile struct {
	*os.File
	c *ioCounter
}

func (f *countedFile) Write(p []byte) (int, error) {
	n, ferr := f.c.allow(len(p))
	k, err := f.File.Write(p[:n])
	f.c.written += int64(k)
	if err == nil && ferr != nil {
		err = &fs.PathError{Op: "write", Path: f.Name(), Err: ferr}
	}
	return k, err
}

func (f *countedFile) WriteAt(p []byte, off int64) (int, error) {
	n, ferr := f.c.allow(len(p))
	k, err := f.File.WriteAt(p[:n], off)
	f.c.written += int64(k)
	if err == nil && ferr != nil {
		err = &fs.PathError{Op: "write", Path: f.Name(), Err: ferr}
	}
	return k, err
}

// syncDir makes renames, creations and removals in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}

// faults are injected by tests: a full disk after some bytes, or a simulated kill at a
// point of the transaction (the export returns errCrash and cleans up nothing, leaving
// the directory exactly as a killed process would).
type faults struct {
	diskBytes int64  // > 0: the disk is full after this many bytes of this export
	crashAt   string // one of the crash points below, or ""
}

const (
	crashBeforeCommit = "before-commit" // journal durable, no commit record
	crashAfterCommit  = "after-commit"  // journal committed, nothing applied
	crashMidApply     = "mid-apply"     // half of the journal's records applied
)

var errCrash = errors.New("simulated crash")

func (f *faults) crash(point string) bool { return f != nil && f.crashAt == point }
