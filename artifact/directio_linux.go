package artifact

import (
	"os"

	"golang.org/x/sys/unix"
)

// openDirect opens path for writes that bypass the page cache (O_DIRECT), or returns
// nil where the file system refuses (tmpfs, some FUSE mounts).
func openDirect(path string) *os.File {
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_DIRECT, 0)
	if err != nil {
		return nil
	}
	return f
}
