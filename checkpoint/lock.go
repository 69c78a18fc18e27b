package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// ErrLocked is returned by Open when another Checkpointer (in this process or another)
// holds the directory: two writers would prune each other's blobs.
var ErrLocked = errors.New("checkpoint directory in use")

// lockDir takes an exclusive flock on dir/LOCK. The kernel drops it when the process
// dies, so a crash never leaves a stale lock behind.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, "LOCK")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock checkpoint %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, dir)
		}
		return nil, fmt.Errorf("lock checkpoint %s: %w", dir, err)
	}
	return f, nil
}
