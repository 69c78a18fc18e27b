package checkpoint

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"
)

// blockWriter holds the directory lock the writer needs, so a test can line up requests
// behind a write in progress. It returns the function that lets the writer go.
func blockWriter(t *testing.T, c *Checkpointer) (release func()) {
	t.Helper()
	c.diskMu.Lock()
	released := false
	release = func() {
		if !released {
			released = true
			c.diskMu.Unlock()
		}
	}
	t.Cleanup(release)
	return release
}

// waitQueue waits until the writer has taken every request but n.
func waitQueue(t *testing.T, c *Checkpointer, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := c.w.Waiting()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue holds %d requests, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func savedRounds(t *testing.T, e *env) []uint64 {
	t.Helper()
	var rounds []uint64
	for _, seq := range e.stateFiles(t) {
		st, err := e.c.readState(seq)
		if err != nil {
			t.Fatal(err)
		}
		rounds = append(rounds, st.Round)
	}
	slices.Reverse(rounds)
	return rounds
}

func TestSaveAsyncLatestWins(t *testing.T) {
	e := newEnv(t)
	snaps := make([]Snapshot, 5)
	for r := range snaps {
		snaps[r] = e.snap(t, uint64(r+1))
	}
	release := blockWriter(t, e.c)
	e.c.SaveAsync(snaps[0])
	waitQueue(t, e.c, 0) // round 1 is in progress (blocked)

	start := time.Now()
	for _, s := range snaps[1:] {
		e.c.SaveAsync(s)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("SaveAsync blocked for %v behind a write in progress", d)
	}
	waitQueue(t, e.c, 1) // only the newest waits

	release()
	if err := e.c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := savedRounds(t, e); !slices.Equal(got, []uint64{1, 5}) {
		t.Fatalf("generations hold rounds %v, want [1 5] (2, 3, 4 superseded)", got)
	}
	e.reopen(t)
	e.checkRound(t, mustLoad(t, e.c), 5)
}

// A synchronous Save is newer than anything queued before it: queued snapshots are
// dropped, and nothing older is written after it.
func TestSaveSupersedesQueuedAsync(t *testing.T) {
	e := newEnv(t)
	s1, s2, s3 := e.snap(t, 1), e.snap(t, 2), e.snap(t, 3)
	release := blockWriter(t, e.c)
	e.c.SaveAsync(s1)
	waitQueue(t, e.c, 0)
	e.c.SaveAsync(s2)

	type res struct {
		st  *State
		err error
	}
	done := make(chan res, 1)
	go func() {
		st, err := e.c.Save(context.Background(), s3)
		done <- res{st, err}
	}()
	waitQueue(t, e.c, 1)
	release()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.st.Round != 3 || r.st.Seq != 2 {
		t.Fatalf("Save returned round %d seq %d, want round 3 seq 2", r.st.Round, r.st.Seq)
	}
	if err := e.c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := savedRounds(t, e); !slices.Equal(got, []uint64{1, 3}) {
		t.Fatalf("generations hold rounds %v, want [1 3]", got)
	}
}

func TestSaveCancelledWhileQueued(t *testing.T) {
	e := newEnv(t)
	s1, s2 := e.snap(t, 1), e.snap(t, 2)
	release := blockWriter(t, e.c)
	e.c.SaveAsync(s1)
	waitQueue(t, e.c, 0)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := e.c.Save(ctx, s2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	release()
	if err := e.c.Flush(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush = %v, want the abandoned save's error", err)
	}
	if got := savedRounds(t, e); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("generations hold rounds %v, want [1]", got)
	}
}

func TestFlushReportsWriteErrors(t *testing.T) {
	tests := []struct {
		name   string
		root   bool // works as root
		damage func(t *testing.T, e *env) (repair func())
	}{
		{"state file path taken by a directory", true, func(t *testing.T, e *env) func() {
			p := e.c.statePath(e.c.lastSeq + 1)
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
			return func() { os.Remove(p) }
		}},
		{"read-only checkpoint directory", false, func(t *testing.T, e *env) func() {
			if err := os.Chmod(e.dir, 0o500); err != nil {
				t.Fatal(err)
			}
			return func() { os.Chmod(e.dir, 0o700) }
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !tt.root && os.Geteuid() == 0 {
				t.Skip("permissions do not stop root")
			}
			e := newEnv(t)
			e.save(t, 1)
			repair := tt.damage(t, e)
			t.Cleanup(repair)

			e.c.SaveAsync(e.snap(t, 2))
			if err := e.c.Flush(context.Background()); err == nil {
				t.Fatal("Flush reported success for a write that cannot succeed")
			}
			if _, err := e.c.Save(context.Background(), e.snap(t, 3)); err == nil {
				t.Fatal("Save reported success for a write that cannot succeed")
			}

			// Once the disk is fixed, the next write succeeds and Flush says so.
			repair()
			e.c.SaveAsync(e.snap(t, 4))
			if err := e.c.Flush(context.Background()); err != nil {
				t.Fatalf("Flush after repair: %v", err)
			}
			e.reopen(t)
			e.checkRound(t, mustLoad(t, e.c), 4)
		})
	}
}

func TestFlushHonoursContext(t *testing.T) {
	e := newEnv(t)
	release := blockWriter(t, e.c)
	defer release()
	e.c.SaveAsync(e.snap(t, 1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := e.c.Flush(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
}

func TestFlushWithNothingQueued(t *testing.T) {
	e := newEnv(t)
	if err := e.c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Concurrent callers: -race checks the queue, and the newest generation must be one of
// the snapshots handed in.
func TestConcurrentSavers(t *testing.T) {
	e := newEnv(t)
	snaps := make([]Snapshot, 8)
	for i := range snaps {
		snaps[i] = e.snap(t, uint64(i+1))
	}
	done := make(chan error, len(snaps))
	for i, s := range snaps {
		go func() {
			if i%2 == 0 {
				e.c.SaveAsync(s)
				done <- nil
				return
			}
			_, err := e.c.Save(context.Background(), s)
			done <- err
		}()
	}
	for range snaps {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := e.c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := mustLoad(t, e.c)
	e.checkRound(t, st, st.Round)
}
