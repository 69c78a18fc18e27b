package export

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// applier carries out a committed transaction's records on the model directory. Every
// operation is idempotent, so a journal can be applied again after a crash in the middle.
type applier struct {
	dir   string
	c     *ioCounter
	files map[string]*countedFile // opened for writing blocks
	order []string
	moved bool // a rename or removal happened: the directory needs an fsync
}

func newApplier(dir string, c *ioCounter) *applier {
	return &applier{dir: dir, c: c, files: map[string]*countedFile{}}
}

// open opens a model file for writing blocks and checks it still has the size the journal
// (or the diff) saw: a file replaced or truncated since is not patched blindly.
func (a *applier) open(name string, size int64) (*countedFile, error) {
	if f, ok := a.files[name]; ok {
		return f, nil
	}
	path := filepath.Join(a.dir, name)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s for writing: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Size() != size {
		f.Close()
		return nil, fmt.Errorf("%s is %d bytes, the sync expected %d: changed by something else", path, st.Size(), size)
	}
	cf := &countedFile{File: f, c: a.c}
	a.files[name] = cf
	a.order = append(a.order, name)
	return cf, nil
}

func (a *applier) block(name string, size, off int64, data []byte) error {
	f, err := a.open(name, size)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(data, off); err != nil {
		return fmt.Errorf("write block at %d of %s: %w", off, f.Name(), err)
	}
	return nil
}

// rename moves a fully written temp file over its model file. A missing temp file with its
// target present means the rename already happened.
func (a *applier) rename(from, to string) error {
	src, dst := filepath.Join(a.dir, from), filepath.Join(a.dir, to)
	err := os.Rename(src, dst)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(dst); serr == nil {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("install %s: %w", dst, err)
	}
	a.moved = true
	return nil
}

func (a *applier) remove(name string) error {
	path := filepath.Join(a.dir, name)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", path, err)
	}
	a.moved = true
	return nil
}

func (a *applier) op(op journalOp) error {
	switch op.kind {
	case recBlock:
		return a.block(op.name, op.size, op.off, op.data)
	case recRename:
		return a.rename(op.from, op.name)
	case recDelete:
		return a.remove(op.name)
	}
	return nil // file declarations need no action
}

// finish makes everything applied durable: the data of patched files, then the directory.
func (a *applier) finish() error {
	var first error
	for _, name := range a.order {
		f := a.files[name]
		// Fdatasync: block writes never change the size, so the inode need not be flushed.
		if err := syscall.Fdatasync(int(f.Fd())); err != nil && first == nil {
			first = fmt.Errorf("sync %s: %w", f.Name(), err)
		}
		if err := f.Close(); err != nil && first == nil {
			first = fmt.Errorf("close %s: %w", f.Name(), err)
		}
	}
	a.files, a.order = map[string]*countedFile{}, nil
	if first != nil {
		return first
	}
	if a.moved {
		return syncDir(a.dir)
	}
	return nil
}

// close releases open files without syncing (after a failure).
func (a *applier) close() {
	for _, f := range a.files {
		f.Close()
	}
	a.files, a.order = map[string]*countedFile{}, nil
}
