package export

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/pack"
)

// crashDirEnv tells the test binary it is the syncing child of TestKillDuringSync.
const crashDirEnv = "P2PNODE_EXPORT_CRASH_DIR"

const (
	crashShard = 5 << 19 // 2.5 MiB: three shards and an index
	crashBlock = 16 << 10
)

// crashVersions are the two models the child syncs between: about 5 MiB in three shards,
// a third of the blocks different, and different rounds and heads in the headers.
func crashVersions(t testing.TB) (a, b *Source) {
	l := pack.Layout{
		{Name: "blocks.0.weight", Shape: []int64{512, 1024}},
		{Name: "blocks.1.weight", Shape: []int64{512, 1024}},
		{Name: "embed.weight", Shape: []int64{256, 1024}},
		{Name: "head.bias", Shape: []int64{1000}},
		{Name: "norm.weight", Shape: []int64{1024}},
	}
	a = memSource(t, l, 11, 1)
	b = withRound(a, 2)
	changeBlocks(b, 0, crashBlock, 0.35, rand.New(rand.NewPCG(5, 5)))
	return a, b
}

// TestHelperCrashSync is the child process of TestKillDuringSync: it syncs the directory
// between the two versions, mostly in place and sometimes as a full export, until killed.
func TestHelperCrashSync(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("child process of TestKillDuringSync")
	}
	a, b := crashVersions(t)
	fmt.Println("ready")
	// A bound in case the parent dies without killing us.
	for i, deadline := 0, time.Now().Add(time.Minute); time.Now().Before(deadline); i++ {
		src := b
		if i%2 == 1 {
			src = a
		}
		opts := Options{ShardBytes: crashShard, BlockBytes: crashBlock, InPlace: i%4 != 3}
		if _, err := Export(ctx, src, dir, opts); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("parent never killed the child")
}

// TestKillDuringSync kills the syncing child with SIGKILL at random moments; after each
// kill, recovery must leave every file of the directory exactly as in one of the two
// versions (all of them from the same one), with no journal or temp file left.
func TestKillDuringSync(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns and kills processes")
	}
	trials := 60
	if s := os.Getenv("P2PNODE_EXPORT_CRASH_TRIALS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		trials = n
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	a, b := crashVersions(t)
	wantA, wantB := expectedHashes(t, a, crashShard), expectedHashes(t, b, crashShard)
	dir := filepath.Join(t.TempDir(), "model")
	_, err := Export(ctx, a, dir, Options{ShardBytes: crashShard})
	require.NoError(t, err)

	start := time.Now()
	found := map[string]int{}
	for trial := range trials {
		delay := time.Duration(rng.Int64N(int64(250 * time.Millisecond)))
		killChild(t, dir, delay)
		found[leftovers(t, dir)]++

		rec, err := Recover(dir, nil)
		require.NoError(t, err, "trial %d", trial)
		found["recovery: "+string(rec)]++
		got := dirHashes(t, dir)
		switch {
		case maps.Equal(got, wantA):
			found["model: old"]++
		case maps.Equal(got, wantB):
			found["model: new"]++
		default:
			t.Fatalf("trial %d (killed after %v): the directory is neither version:\n got %v\n old %v\n new %v", trial, delay, got, wantA, wantB)
		}
	}
	t.Logf("%d kills in %v: %v", trials, time.Since(start).Round(time.Millisecond), found)
	require.Positive(t, found["recovery: "+string(RecoveryReapplied)]+found["recovery: "+string(RecoveryDiscarded)],
		"no kill landed while a journal existed: the test proves nothing")
}

// killChild starts the syncing child, lets it run for delay after it is ready, and kills it.
func killChild(t *testing.T, dir string, delay time.Duration) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCrashSync$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- nil
				for sc.Scan() {
				}
				return
			}
		}
		ready <- errors.New("child exited before it was ready")
	}()
	select {
	case err := <-ready:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("child never became ready")
	}
	time.Sleep(delay)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err = cmd.Wait()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee) && !ee.Exited(), "the child must die of the kill, not exit: %v", err)
}

// leftovers classifies what a kill left in dir before recovery.
func leftovers(t *testing.T, dir string) string {
	t.Helper()
	temps := 0
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		if isTempFile(e.Name()) {
			temps++
		}
	}
	f, err := os.Open(filepath.Join(dir, JournalFile))
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Sprintf("killed: no journal, %s temp files", some(temps))
	}
	require.NoError(t, err)
	defer f.Close()
	st, err := f.Stat()
	require.NoError(t, err)
	if decodeJournal(f, st.Size(), nil) == nil {
		return "killed: journal committed"
	}
	return "killed: journal not committed"
}

func some(n int) string {
	if n == 0 {
		return "no"
	}
	return "some"
}
