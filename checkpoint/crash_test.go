package checkpoint

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
)

// crashDirEnv tells the test binary it is the writer child of TestCrashRecovery.
const crashDirEnv = "P2PNODE_CHECKPOINT_CRASH_DIR"

// crashBlobSize varies the momentum blob over 1–4 MiB with the round, so kills land in
// writes of different lengths.
func crashBlobSize(round uint64) int {
	return 1<<20 + int(round*2654435761%(3<<20))
}

func crashSnapshot(shared *artifact.Store, round uint64) (Snapshot, error) {
	params, err := shared.PutBytes(blobData(round, "params", 4096))
	if err != nil {
		return Snapshot{}, err
	}
	return Snapshot{
		Round: round,
		Head:  headOf(round),
		Meta:  map[string]string{"round": strconv.FormatUint(round, 10)},
		Large: map[string][]byte{
			"momentum": blobData(round, "momentum", crashBlobSize(round)),
			"residual": blobData(round, "residual", 64<<10),
		},
		Keep: map[string]cid.Cid{"params": params},
	}, nil
}

func checkCrashState(c *Checkpointer, st *State) error {
	want := map[string][]byte{
		"momentum": blobData(st.Round, "momentum", crashBlobSize(st.Round)),
		"residual": blobData(st.Round, "residual", 64<<10),
		"params":   blobData(st.Round, "params", 4096),
	}
	if st.Head != headOf(st.Round) || st.Meta["round"] != strconv.FormatUint(st.Round, 10) {
		return fmt.Errorf("round %d: head %s meta %v do not belong to it", st.Round, st.Head, st.Meta)
	}
	if len(st.Blobs)+len(st.Refs) != len(want) {
		return fmt.Errorf("round %d: %d blobs, want %d", st.Round, len(st.Blobs)+len(st.Refs), len(want))
	}
	for name, data := range want {
		b, err := c.OpenBlob(st, name)
		if err != nil {
			return err
		}
		same := bytes.Equal(b.Bytes(), data)
		b.Close()
		if !same {
			return fmt.Errorf("round %d: blob %q is not the one saved for this round", st.Round, name)
		}
	}
	return nil
}

// TestHelperWriter is the child process of TestCrashRecovery: it resumes from the
// checkpoint, then saves rounds forever (synchronously, in the background, and in the
// background followed by Flush) and prints "durable <round>" whenever a save is known to
// be durable, until the parent kills it.
func TestHelperWriter(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("child process of TestCrashRecovery")
	}
	shared, err := artifact.OpenStore(filepath.Join(dir, "shared"), artifact.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(filepath.Join(dir, "ckpt"), shared, nil)
	if err != nil {
		t.Fatal(err)
	}
	var round uint64
	switch st, err := c.Load(); {
	case err == nil:
		round = st.Round
	case !errors.Is(err, ErrNoState):
		t.Fatal(err)
	}
	fmt.Println("ready")
	ctx := context.Background()
	// A bound in case the parent dies without killing us.
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		round++
		s, err := crashSnapshot(shared, round)
		if err != nil {
			t.Fatal(err)
		}
		switch round % 3 {
		case 0:
			if _, err := c.Save(ctx, s); err != nil {
				t.Fatal(err)
			}
			fmt.Printf("durable %d\n", round)
		case 1:
			c.SaveAsync(s)
		case 2:
			c.SaveAsync(s)
			if err := c.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			fmt.Printf("durable %d\n", round)
		}
	}
	t.Fatal("parent never killed the writer")
}

func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns and kills processes")
	}
	trials := 60
	if s := os.Getenv("P2PNODE_CHECKPOINT_CRASH_TRIALS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		trials = n
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	dir := t.TempDir()
	start := time.Now()

	var maxDurable, lastLoaded uint64
	for trial := range trials {
		durable := runAndKill(t, dir, rng)
		maxDurable = max(maxDurable, durable)

		shared, err := artifact.OpenStore(filepath.Join(dir, "shared"), artifact.Options{})
		if err != nil {
			t.Fatal(err)
		}
		c, err := Open(filepath.Join(dir, "ckpt"), shared, nil)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		st, err := c.Load()
		switch {
		case errors.Is(err, ErrNoState) && maxDurable == 0:
			c.Close()
			continue
		case err != nil:
			t.Fatalf("trial %d: Load after round %d was durable: %v", trial, maxDurable, err)
		}
		if st.Round < maxDurable {
			t.Fatalf("trial %d: loaded round %d, but round %d was reported durable", trial, st.Round, maxDurable)
		}
		if st.Round < lastLoaded {
			t.Fatalf("trial %d: loaded round %d after round %d: went backwards", trial, st.Round, lastLoaded)
		}
		lastLoaded = st.Round
		if err := checkCrashState(c, st); err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		// Pruning keeps up despite the crashes: the kept generations, one more whose
		// pruning a kill interrupted, and the blobs of one interrupted save.
		if seqs, _ := c.listSeqs(); len(seqs) > keepGenerations+1 {
			t.Fatalf("trial %d: %d state files on disk", trial, len(seqs))
		}
		if ids, _ := c.own.List(); len(ids) > 2*(keepGenerations+2) {
			t.Fatalf("trial %d: %d blobs in the checkpoint store", trial, len(ids))
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if maxDurable < 10 {
		t.Fatalf("only %d rounds became durable in %d trials: the test exercised little", maxDurable, trials)
	}
	t.Logf("%d kills in %v; %d rounds durable, last loaded %d", trials, time.Since(start).Round(time.Millisecond), maxDurable, lastLoaded)
}

// runAndKill starts the writer child on dir, SIGKILLs it at a random moment and returns
// the last round it reported durable.
func runAndKill(t *testing.T, dir string, rng *rand.Rand) uint64 {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWriter$")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}

	var durable atomic.Uint64
	ready := make(chan struct{})
	progress := make(chan struct{}, 1<<10) // one token per "durable" line
	readDone := make(chan struct{})
	var out strings.Builder // written by the reader only, read after readDone
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			out.WriteString(line + "\n")
			if line == "ready" {
				close(ready)
			}
			if n, ok := strings.CutPrefix(line, "durable "); ok {
				if r, err := strconv.ParseUint(n, 10, 64); err == nil {
					durable.Store(r)
					select {
					case progress <- struct{}{}:
					default:
					}
				}
			}
		}
	}()

	// Kill after a random number of durable saves plus a random delay, rather than after
	// a random time alone, so every trial makes progress however loaded the machine is,
	// and kills still land anywhere in a save (blob, state file, pruning) or in the next
	// round's start.
	if rng.IntN(10) == 0 {
		// Sometimes kill during start-up: Open's clean-up and Load's repairs.
		time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
	} else {
		timeout := time.After(30 * time.Second)
		waitFor := func(ch <-chan struct{}) bool {
			select {
			case <-ch:
				return true
			case <-readDone:
			case <-timeout:
				t.Error("writer child made no progress in 30s")
			}
			return false
		}
		ok := waitFor(ready)
		for n := rng.IntN(3); ok && n > 0; n-- {
			ok = waitFor(progress)
		}
		time.Sleep(time.Duration(rng.IntN(80)) * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-readDone
	waitErr := cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("writer child ended on its own (%v):\n%s%s", waitErr, out.String(), stderr.String())
	}
	return durable.Load()
}
