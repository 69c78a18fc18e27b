package pyruntime

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Scratch directories we create are named p2pnode-<pid>-<random> and hold a lock file
// that their process keeps locked (flock) for as long as it uses them. The kernel drops
// the lock when the process dies however it dies, so a later start can tell the
// directories of dead processes (lock free) from live ones (lock held) and remove the
// former, so that a process killed with kill -9 does not leave a model's worth of /dev/shm
// behind.
const (
	scratchPrefix   = "p2pnode-"
	scratchLockName = ".p2pnode.lock"
)

var (
	scratchMu    sync.Mutex
	scratchLocks = map[string]*os.File{} // dir -> its open, locked lock file
)

// newScratchDir creates and locks a fresh scratch directory under base.
func newScratchDir(base string) (string, error) {
	// Held while the directory exists unlocked, so that a sweep in this process never
	// sees it half made.
	scratchMu.Lock()
	defer scratchMu.Unlock()
	dir, err := os.MkdirTemp(base, fmt.Sprintf("%s%d-*", scratchPrefix, os.Getpid()))
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(filepath.Join(dir, scratchLockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err != nil {
			f.Close()
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("lock scratch dir %s: %w", dir, err)
	}
	scratchLocks[dir] = f
	return dir, nil
}

// removeScratch removes a scratch directory we created, then releases its lock.
func removeScratch(dir string) error {
	err := os.RemoveAll(dir)
	scratchMu.Lock()
	f := scratchLocks[dir]
	delete(scratchLocks, dir)
	scratchMu.Unlock()
	if f != nil {
		f.Close()
	}
	return err
}

// sweepScratch removes the scratch directories under base that dead processes left
// behind and returns their paths. A directory is dead when nobody holds its lock and the
// process named in it is gone (or is this one, which knows its own directories): another
// process may be between creating a directory and locking it. Other entries are left
// alone.
func sweepScratch(base string) ([]string, error) {
	scratchMu.Lock()
	defer scratchMu.Unlock()
	ents, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sweep scratch dirs in %s: %w", base, err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		pid, ok := scratchPID(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		dir := filepath.Join(base, e.Name())
		if !scratchDead(dir, pid) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove dead scratch dir %s: %w", dir, err))
			continue
		}
		removed = append(removed, dir)
	}
	return removed, errors.Join(errs...)
}

// scratchPID parses p2pnode-<pid>-<random>.
func scratchPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, scratchPrefix)
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(num)
	return pid, err == nil && pid > 0
}

func scratchDead(dir string, pid int) bool {
	if _, ours := scratchLocks[dir]; ours {
		return false
	}
	if pid != os.Getpid() && processAlive(pid) {
		return false
	}
	f, err := os.OpenFile(filepath.Join(dir, scratchLockName), os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	defer f.Close()
	// A reused pid may hold the lock; ours is released when f closes, after the directory
	// is gone.
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil
}

// processAlive says whether pid names a process that still runs. A zombie (exited, not yet
// reaped by its parent) answers signal 0 like a live process, but it is dead to the sweep:
// its files are closed and its locks released once its last thread has exited (the leader
// shows Z a moment before that; scratchDead's lock check covers the moment).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	if err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	state, ok := procState(pid)
	return !ok || (state != 'Z' && state != 'X')
}

// procState is the state letter of pid in /proc/<pid>/stat ('R', 'S', 'Z', ...); false
// where /proc cannot say.
func procState(pid int) (byte, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// "pid (comm) S ...": comm may hold spaces and parentheses, so the state follows the
	// last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0, false
	}
	return b[i+2], true
}

// sweepScratchDirs sweeps every place we make scratch directories in and logs what it
// removed.
func sweepScratchDirs(log *slog.Logger, bases ...string) {
	for _, base := range bases {
		if base == "" {
			continue
		}
		removed, err := sweepScratch(base)
		if len(removed) > 0 {
			log.Info("removed scratch directories left by dead processes", "dir", base, "count", len(removed), "removed", removed)
		}
		if err != nil {
			log.Warn("sweep scratch directories", "err", err)
		}
	}
}

// scratchBases are the directories makeScratch creates scratch directories in.
func scratchBases() []string {
	var out []string
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		out = append(out, "/dev/shm")
	}
	return append(out, os.TempDir())
}
