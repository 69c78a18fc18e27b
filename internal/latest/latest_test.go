package latest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"
)

// rig records what the writer did. Writes of a value in block wait for release first.
type rig struct {
	mu      sync.Mutex
	written []int
	dropped map[int]error
	fail    map[int]error // Write's error for a value

	block   map[int]bool
	started chan int // a blocked write has started
	release chan struct{}
	once    sync.Once
}

// unblock lets blocked writes go; it may be called more than once.
func (r *rig) unblock() { r.once.Do(func() { close(r.release) }) }

// waitDropped waits until v is dropped.
func (r *rig) waitDropped(t *testing.T, v int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, dropped := r.state(); dropped[v] != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("value %d not dropped", v)
		}
		time.Sleep(time.Millisecond)
	}
}

func newRig() *rig {
	return &rig{dropped: map[int]error{}, fail: map[int]error{}, block: map[int]bool{},
		started: make(chan int, 16), release: make(chan struct{})}
}

func (r *rig) writer() *Writer[int, string] {
	return New(Options[int, string]{
		Write: func(ctx context.Context, v int) (string, error) {
			if r.block[v] {
				r.started <- v
				select {
				case <-r.release:
				case <-ctx.Done():
					return "", fmt.Errorf("write %d: %w", v, ctx.Err())
				}
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if err := r.fail[v]; err != nil {
				return "", err
			}
			r.written = append(r.written, v)
			return fmt.Sprint("wrote ", v), nil
		},
		Drop: func(v int, why error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if _, twice := r.dropped[v]; twice {
				panic(fmt.Sprintf("value %d dropped twice", v))
			}
			r.dropped[v] = why
		},
		Name: func(v int) string { return fmt.Sprintf("value %d", v) },
		What: "values",
	})
}

func (r *rig) state() (written []int, dropped map[int]error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.written), maps.Clone(r.dropped)
}

func waitWaiting(t *testing.T, w *Writer[int, string], n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for w.Waiting() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d values waiting, want %d", w.Waiting(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

var errDisk = errors.New("disk full")

func TestWriter(t *testing.T) {
	tests := []struct {
		name string
		// run drives the writer while value 1's write is blocked and in progress; the
		// write is released after run returns, then Flush is called.
		run         func(t *testing.T, w *Writer[int, string], r *rig)
		fail        map[int]error
		wantWritten []int
		wantDropped map[int]error // by errors.Is
		wantFlush   error         // by errors.Is; nil: no error
	}{
		{
			name: "latest submission wins",
			run: func(t *testing.T, w *Writer[int, string], r *rig) {
				for v := 2; v <= 5; v++ {
					if err := w.Submit(v); err != nil {
						t.Fatal(err)
					}
				}
				waitWaiting(t, w, 1)
			},
			wantWritten: []int{1, 5},
			wantDropped: map[int]error{2: ErrSuperseded, 3: ErrSuperseded, 4: ErrSuperseded},
		},
		{
			name: "Do supersedes waiting submissions and answers",
			run: func(t *testing.T, w *Writer[int, string], r *rig) {
				w.Submit(2)
				done := make(chan error, 1)
				go func() {
					got, err := w.Do(context.Background(), 3)
					if err == nil && got != "wrote 3" {
						err = fmt.Errorf("Do = %q, want %q", got, "wrote 3")
					}
					done <- err
				}()
				r.waitDropped(t, 2) // the Do has queued
				w.Submit(4)         // newer than the Do: waits behind it, not dropped
				waitWaiting(t, w, 2)
				r.unblock()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			},
			wantWritten: []int{1, 3, 4},
			wantDropped: map[int]error{2: ErrSuperseded},
		},
		{
			name: "Do abandoned before it started is dropped and reported by Flush",
			run: func(t *testing.T, w *Writer[int, string], r *rig) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
				defer cancel()
				_, err := w.Do(ctx, 2)
				if !errors.Is(err, context.DeadlineExceeded) || err.Error() != "value 2: context deadline exceeded" {
					t.Fatalf("Do = %v, want value 2's DeadlineExceeded", err)
				}
			},
			wantWritten: []int{1},
			wantDropped: map[int]error{2: ErrAbandoned},
			wantFlush:   ErrAbandoned,
		},
		{
			name: "write error reported by Flush",
			run: func(t *testing.T, w *Writer[int, string], r *rig) {
				w.Submit(2)
			},
			fail:        map[int]error{2: errDisk},
			wantWritten: []int{1},
			wantDropped: map[int]error{},
			wantFlush:   errDisk,
		},
		{
			name: "a later success makes an earlier error moot",
			run: func(t *testing.T, w *Writer[int, string], r *rig) {
				r.unblock()
				w.Submit(2)
				if err := w.Flush(context.Background()); !errors.Is(err, errDisk) {
					t.Fatalf("Flush = %v, want %v", err, errDisk)
				}
				if _, err := w.Do(context.Background(), 3); !errors.Is(err, errDisk) {
					t.Fatalf("Do = %v, want %v", err, errDisk)
				}
				w.Submit(4)
			},
			fail:        map[int]error{2: errDisk, 3: errDisk},
			wantWritten: []int{1, 4},
			wantDropped: map[int]error{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig()
			r.fail = tt.fail
			r.block[1] = true
			w := r.writer()
			defer func() { r.unblock(); w.Close(context.Background()) }()
			w.Submit(1)
			<-r.started
			tt.run(t, w, r)
			r.unblock()
			err := w.Flush(context.Background())
			if tt.wantFlush == nil && err != nil || !errors.Is(err, tt.wantFlush) {
				t.Fatalf("Flush = %v, want %v", err, tt.wantFlush)
			}
			written, dropped := r.state()
			if !slices.Equal(written, tt.wantWritten) {
				t.Errorf("written %v, want %v", written, tt.wantWritten)
			}
			if len(dropped) != len(tt.wantDropped) {
				t.Errorf("dropped %v, want %v", dropped, tt.wantDropped)
			}
			for v, why := range tt.wantDropped {
				if !errors.Is(dropped[v], why) {
					t.Errorf("value %d dropped with %v, want %v", v, dropped[v], why)
				}
			}
		})
	}
}

func TestClose(t *testing.T) {
	tests := []struct {
		name        string
		giveUp      bool // Close's context is already cancelled
		wantWritten []int
		wantDropped map[int]error
		wantErr     error
	}{
		// The final write is never lost: Close writes what waits before it returns.
		{name: "writes the value waiting", wantWritten: []int{1, 3}, wantDropped: map[int]error{2: ErrSuperseded}},
		{name: "gives up when asked", giveUp: true, wantWritten: nil,
			wantDropped: map[int]error{2: ErrSuperseded, 3: context.Canceled}, wantErr: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig()
			r.block[1] = true
			w := r.writer()
			w.Submit(1)
			<-r.started
			w.Submit(2)
			w.Submit(3)
			ctx, cancel := context.WithCancel(context.Background())
			if tt.giveUp {
				cancel()
			} else {
				defer cancel()
				time.AfterFunc(10*time.Millisecond, r.unblock)
			}
			err := w.Close(ctx)
			if tt.wantErr == nil && err != nil || !errors.Is(err, tt.wantErr) {
				t.Fatalf("Close = %v, want %v", err, tt.wantErr)
			}
			written, dropped := r.state()
			if !slices.Equal(written, tt.wantWritten) {
				t.Errorf("written %v, want %v", written, tt.wantWritten)
			}
			for v, why := range tt.wantDropped {
				if !errors.Is(dropped[v], why) {
					t.Errorf("value %d dropped with %v, want %v", v, dropped[v], why)
				}
			}

			// After Close nothing is taken, and what is handed in is dropped.
			if err := w.Submit(4); !errors.Is(err, ErrClosed) {
				t.Errorf("Submit after Close = %v, want ErrClosed", err)
			}
			if _, err := w.Do(context.Background(), 5); !errors.Is(err, ErrClosed) {
				t.Errorf("Do after Close = %v, want ErrClosed", err)
			}
			_, dropped = r.state()
			for _, v := range []int{4, 5} {
				if !errors.Is(dropped[v], ErrClosed) {
					t.Errorf("value %d dropped with %v, want ErrClosed", v, dropped[v])
				}
			}
			if err2 := w.Close(context.Background()); !errors.Is(err2, tt.wantErr) && (err2 != nil || tt.wantErr != nil) {
				t.Errorf("second Close = %v, want %v", err2, tt.wantErr)
			}
		})
	}
}

func TestFlushHonoursContext(t *testing.T) {
	r := newRig()
	r.block[1] = true
	w := r.writer()
	defer func() { r.unblock(); w.Close(context.Background()) }()
	w.Submit(1)
	<-r.started
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	err := w.Flush(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || err.Error() != "flush values: context deadline exceeded" {
		t.Fatalf("Flush = %v, want flush values: DeadlineExceeded", err)
	}
}

// Many callers at once: -race checks the writer; every value is written or dropped exactly
// once (Drop panics on a second drop), and the last Do's value is written.
func TestConcurrentCallers(t *testing.T) {
	r := newRig()
	w := r.writer()
	const n = 64
	var wg sync.WaitGroup
	for v := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v%3 == 0 {
				if _, err := w.Do(context.Background(), v); err != nil {
					t.Error(err)
				}
				return
			}
			w.Submit(v)
		}()
	}
	wg.Wait()
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	written, dropped := r.state()
	seen := map[int]int{}
	for _, v := range written {
		seen[v]++
	}
	for v := range dropped {
		seen[v]++
	}
	for v := range n {
		if seen[v] != 1 {
			t.Errorf("value %d written or dropped %d times, want 1", v, seen[v])
		}
		if v%3 == 0 && !slices.Contains(written, v) {
			t.Errorf("Do's value %d not written", v)
		}
	}
}
