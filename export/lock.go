package export

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ErrBusy is returned when another export, sync or verify holds the model directory.
var ErrBusy = errors.New("model directory is busy")

// lockDir takes an exclusive flock on the directory itself, so that the node's background
// writer and a manual `p2pnode export` never interleave their transactions. Locking the
// directory (not a lock file in it) writes nothing, so it works on read-only directories
// too, and the kernel drops the lock when a process dies.
func lockDir(dir string) (unlock func(), err error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("lock model directory %s: %w", dir, err)
	}
	if err := syscall.Flock(int(d.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		d.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s: another export or verify is using it", ErrBusy, dir)
		}
		return nil, fmt.Errorf("lock model directory %s: %w", dir, err)
	}
	return func() {
		_ = syscall.Flock(int(d.Fd()), syscall.LOCK_UN)
		d.Close()
	}, nil
}

// ensureDir creates dir if needed and checks that it is a directory.
func ensureDir(dir string) error {
	st, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create model directory: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("model directory: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("model directory %s: %w", dir, ErrNotDir)
	}
	return nil
}

// ErrNotDir is returned when the model directory's path names something else.
var ErrNotDir = errors.New("not a directory")
