package pyruntime

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// scratchHelperEnv makes the test binary a process that creates a scratch directory under
// the given base, prints its path and waits to be killed.
const scratchHelperEnv = "P2PNODE_SCRATCH_HELPER"

func scratchHelper(base string) {
	dir, err := newScratchDir(base)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	// A pack, as a worker would leave one.
	_ = os.WriteFile(filepath.Join(dir, "params.safetensors"), make([]byte, 1<<20), 0o600)
	fmt.Println(dir)
	time.Sleep(time.Minute)
	os.Exit(0)
}

// startScratchHelper starts a process that holds a scratch directory under base.
func startScratchHelper(t *testing.T, base string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), scratchHelperEnv+"="+base)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	dir := strings.TrimSpace(line)
	require.True(t, strings.HasPrefix(dir, base), "helper said %q", dir)
	return cmd, dir
}

// Scratch directories of processes killed with SIGKILL are removed by the next sweep;
// those of live processes (this one's, another's, one being created) and anything not
// ours stay.
func TestSweepRemovesScratchOfKilledProcesses(t *testing.T) {
	base := t.TempDir()
	var dead []string
	for range 3 {
		cmd, dir := startScratchHelper(t, base)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		dead = append(dead, dir)
	}
	other, liveOther := startScratchHelper(t, base)
	liveOwn, err := newScratchDir(base)
	require.NoError(t, err)
	t.Cleanup(func() { removeScratch(liveOwn) })
	// Made by a live process that has not locked it yet.
	creating := filepath.Join(base, fmt.Sprintf("%s%d-123", scratchPrefix, os.Getppid()))
	// Left by an old version (no pid in the name), and not ours at all.
	notOurs := []string{filepath.Join(base, "p2pnode-abc123"), filepath.Join(base, "p2pnode-modelconfig-1"), filepath.Join(base, "other")}
	for _, d := range append([]string{creating}, notOurs...) {
		require.NoError(t, os.Mkdir(d, 0o700))
	}
	// A dead process's directory that never got its lock file.
	unlocked := filepath.Join(base, fmt.Sprintf("%s%d-456", scratchPrefix, deadPID(t)))
	require.NoError(t, os.Mkdir(unlocked, 0o700))

	removed, err := sweepScratch(base)
	require.NoError(t, err)
	require.ElementsMatch(t, append(dead, unlocked), removed)
	for _, d := range append(dead, unlocked) {
		require.NoDirExists(t, d)
	}
	for _, d := range append([]string{liveOther, liveOwn, creating}, notOurs...) {
		require.DirExists(t, d)
	}
	require.FileExists(t, filepath.Join(liveOther, "params.safetensors"))

	// Once its process is killed, the other live one goes too.
	require.NoError(t, other.Process.Signal(syscall.SIGKILL))
	_ = other.Wait()
	removed, err = sweepScratch(base)
	require.NoError(t, err)
	require.Equal(t, []string{liveOther}, removed)
	require.DirExists(t, liveOwn)
}

// deadPID is the pid of a process that has exited.
func deadPID(t *testing.T) int {
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	return cmd.Process.Pid
}

func TestMakeScratchNamesAndLocksItsDirectory(t *testing.T) {
	dir, own, err := makeScratch("")
	require.NoError(t, err)
	require.True(t, own)
	t.Cleanup(func() { removeScratch(dir) })
	pid, ok := scratchPID(filepath.Base(dir))
	require.True(t, ok, dir)
	require.Equal(t, os.Getpid(), pid)
	require.FileExists(t, filepath.Join(dir, scratchLockName))
	require.NoError(t, removeScratch(dir))
	require.NoDirExists(t, dir)
}

// A process that has exited but is not yet reaped (a zombie) is dead: its lock is released
// and the sweep removes its directory. Table: what processAlive says of each kind of pid.
func TestProcessAliveTreatsZombiesAsDead(t *testing.T) {
	live := exec.Command("sleep", "60")
	require.NoError(t, live.Start())
	t.Cleanup(func() { live.Process.Kill(); live.Wait() })
	zombie := startZombie(t)
	for _, tc := range []struct {
		name  string
		pid   int
		alive bool
	}{
		{"this process", os.Getpid(), true},
		{"a running child", live.Process.Pid, true},
		{"init (another user's, signal refused or not)", 1, true},
		{"an exited, unreaped child", zombie.Process.Pid, false},
		{"an exited, reaped child", deadPID(t), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.alive, processAlive(tc.pid))
		})
	}
}

func TestSweepRemovesScratchOfZombies(t *testing.T) {
	base := t.TempDir()
	cmd, dir := startScratchHelper(t, base)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	waitState(t, cmd.Process.Pid, 'Z') // not reaped: no Wait yet
	// The thread group leader shows Z as soon as it has exited, while the helper's other
	// threads may still be exiting and holding its files (and so the lock) for a moment:
	// the sweep leaves the directory until the lock is free. Wait for that, the process
	// still a zombie throughout (nothing reaps it before the test ends).
	var removed []string
	require.Eventually(t, func() bool {
		var err error
		removed, err = sweepScratch(base)
		require.NoError(t, err)
		return len(removed) > 0
	}, 30*time.Second, 10*time.Millisecond, "the zombie's scratch directory was never swept")
	require.Equal(t, []string{dir}, removed)
	require.NoDirExists(t, dir)
	st, ok := procState(cmd.Process.Pid)
	require.True(t, ok && st == 'Z', "the helper is still an unreaped zombie when its directory goes")
}

// startZombie starts a child that exits at once and is left unreaped until the test ends.
func startZombie(t *testing.T) *exec.Cmd {
	cmd := exec.Command("true")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Wait() })
	waitState(t, cmd.Process.Pid, 'Z')
	return cmd
}

// waitState waits until pid is in state want (its exit takes a moment on a loaded machine).
func waitState(t *testing.T, pid int, want byte) {
	t.Helper()
	require.Eventually(t, func() bool {
		s, ok := procState(pid)
		return ok && s == want
	}, 30*time.Second, 10*time.Millisecond, "pid %d never reached state %c", pid, want)
}
