package pyruntime

import (
	"fmt"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"
)

// ScratchPacks is how many fp32 copies of the model the scratch directory must hold at
// once: a trainer's local pack, and the inner optimizer's state read and written in the
// same call (AdamW keeps two fp32 tensors per parameter: 2 in + 2 out).
const ScratchPacks = 5

// scratchNeed is the bytes the scratch directory needs for a model of params parameters.
func scratchNeed(params int64) int64 { return ScratchPacks * 4 * params }

// freeBytes is the space an unprivileged writer has left on dir's file system.
func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// scratchChoice is the outcome of fitScratch.
type scratchChoice struct {
	dir      string
	own      bool  // remove dir on Close
	switched bool  // dir is a new directory under the disk fallback
	need     int64 // bytes the packs need
	free     int64 // bytes free where the packs were going to go
}

// fitScratch checks that dir has room for the packs of a model of params parameters before
// the first round, so that a small tmpfs (a container's /dev/shm is 64 MiB by default)
// never fails a round half-way through a write. Too small, and with a fallback on disk
// given, it makes a fresh directory under fallback and returns that (the caller removes
// the old one if it owns it); without a fallback it keeps dir. A fallback too small as well
// is an error naming both sizes.
func fitScratch(dir string, params int64, fallback string) (scratchChoice, error) {
	c := scratchChoice{dir: dir, need: scratchNeed(params)}
	free, err := freeBytes(dir)
	if err != nil {
		return c, fmt.Errorf("pyruntime: scratch dir: %w", err)
	}
	c.free = free
	if free >= c.need || fallback == "" {
		return c, nil
	}
	if err := os.MkdirAll(fallback, 0o700); err != nil {
		return c, fmt.Errorf("pyruntime: disk scratch dir %s: %w", fallback, err)
	}
	diskFree, err := freeBytes(fallback)
	if err != nil {
		return c, fmt.Errorf("pyruntime: disk scratch dir: %w", err)
	}
	if diskFree < c.need {
		return c, fmt.Errorf("pyruntime: scratch: packs of %d parameters need %s; %s has %s free and the disk scratch dir %s %s",
			params, humanBytes(c.need), dir, humanBytes(free), fallback, humanBytes(diskFree))
	}
	d, err := newScratchDir(fallback)
	if err != nil {
		return c, fmt.Errorf("pyruntime: disk scratch dir %s: %w", fallback, err)
	}
	c.dir, c.own, c.switched = d, true, true
	return c, nil
}

// logScratch says where packs go, and warns once when the tmpfs was too small.
func logScratch(log *slog.Logger, from string, c scratchChoice, hasFallback bool) {
	switch {
	case c.switched:
		log.Warn("scratch dir too small for the packs: using a directory on disk instead (raise the container's --shm-size / shm_size to keep packs in memory)",
			"need", humanBytes(c.need), "free", humanBytes(c.free), "dir", from, "disk_dir", c.dir)
	case c.free < c.need && !hasFallback:
		log.Warn("scratch dir may be too small for the packs and no disk fallback is set",
			"need", humanBytes(c.need), "free", humanBytes(c.free), "scratch", c.dir)
	}
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
