package checkpoint

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/cids"
)

func (s *testSource) cidOf() cid.Cid { return cids.Record(s.b) }

// testSource streams b, counting Close calls; WriteTo waits for gate (if set) first.
type testSource struct {
	b      []byte
	gate   chan struct{}
	closed atomic.Int32
}

func (s *testSource) WriteTo(w io.Writer) (int64, error) {
	if s.gate != nil {
		<-s.gate
	}
	n, err := w.Write(s.b)
	return int64(n), err
}
func (s *testSource) Size() int64      { return int64(len(s.b)) }
func (s *testSource) Describe() string { return "test source" }
func (s *testSource) Close() error     { s.closed.Add(1); return nil }

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// tmpEmpty fails unless the checkpoint's own store has no temporary files left.
func tmpEmpty(t *testing.T, e *env) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.dir, "blobs", "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("half-written blob left behind: %v", ents[0].Name())
	}
}

func TestStreamsAreStoredLikeLargeBlobs(t *testing.T) {
	e := newEnv(t)
	opt := blobData(1, "opt", 3<<20+17)
	path := filepath.Join(t.TempDir(), "opt.safetensors")
	writeFile(t, path, opt)
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The file may go before the writer reads it: the open descriptor keeps its bytes.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	res := &testSource{b: blobData(1, "res", 1<<20)}
	saved, err := e.c.Save(context.Background(), Snapshot{Round: 1, Streams: map[string]Source{"opt": f, "res": res},
		Large: map[string][]byte{"small": []byte("x")}})
	if err != nil {
		t.Fatal(err)
	}
	if res.closed.Load() != 1 {
		t.Fatalf("source closed %d times, want 1", res.closed.Load())
	}
	e.reopen(t)
	st := mustLoad(t, e.c)
	if st.Seq != saved.Seq || len(st.Blobs) != 3 {
		t.Fatalf("loaded %+v", st)
	}
	for name, want := range map[string][]byte{"opt": opt, "res": res.b, "small": []byte("x")} {
		b, err := e.c.OpenBlob(st, name)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(b.Bytes(), want) {
			t.Fatalf("blob %q differs", name)
		}
		b.Close()
	}
	// The same bytes through Large give the same blob.
	again, err := e.c.Save(context.Background(), Snapshot{Round: 2, Large: map[string][]byte{"opt": opt}})
	if err != nil {
		t.Fatal(err)
	}
	if again.Blobs["opt"] != st.Blobs["opt"] {
		t.Fatalf("streamed blob %s, same bytes from memory %s", st.Blobs["opt"], again.Blobs["opt"])
	}
}

// TestStreamBadInput: a source file truncated after it was opened, a source that runs
// long, and a source that says it has no blob.
func TestStreamBadInput(t *testing.T) {
	e := newEnv(t)
	first, err := e.c.Save(context.Background(), Snapshot{Round: 1, Large: map[string][]byte{"opt": []byte("old")}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "opt-2.safetensors")
	writeFile(t, path, blobData(2, "opt", 2<<20))
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 1<<20+5); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.Save(context.Background(), Snapshot{Round: 2, Streams: map[string]Source{"opt": f}})
	if err == nil || !strings.Contains(err.Error(), `blob "opt"`) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("truncated source: err = %v", err)
	}
	long := &lyingSource{testSource{b: make([]byte, 100)}}
	_, err = e.c.Save(context.Background(), Snapshot{Round: 2, Streams: map[string]Source{"res": long}})
	if err == nil || !strings.Contains(err.Error(), `blob "res"`) || !strings.Contains(err.Error(), "100 bytes written, the source has 99") {
		t.Fatalf("long source: err = %v", err)
	}
	tmpEmpty(t, e)
	e.reopen(t)
	if st := mustLoad(t, e.c); st.Seq != first.Seq {
		t.Fatalf("a failed save left generation %d", st.Seq)
	}
	none, err := e.c.Save(context.Background(), Snapshot{Round: 3, Streams: map[string]Source{"res": noBlob{}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(none.Blobs) != 0 {
		t.Fatalf("ErrNoBlob source stored %v", none.Blobs)
	}
}

type lyingSource struct{ testSource }

func (s *lyingSource) Size() int64 { return int64(len(s.b)) - 1 }

type noBlob struct{}

func (noBlob) WriteTo(io.Writer) (int64, error) { return 0, ErrNoBlob }
func (noBlob) Size() int64                      { return -1 }
func (noBlob) Describe() string                 { return "nothing" }
func (noBlob) Close() error                     { return nil }

// TestStreamFullDisk writes a checkpoint onto a tmpfs too small for the streamed blob:
// the error names the blob and the disk's error, the previous generation is intact and
// no partial blob is left.
func TestStreamFullDisk(t *testing.T) {
	root := t.TempDir()
	mnt := filepath.Join(root, "small")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=2m"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v)", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH) })
	e := &env{dir: filepath.Join(mnt, "ckpt")}
	e.reopen(t)
	first, err := e.c.Save(context.Background(), Snapshot{Round: 1, Large: map[string][]byte{"opt": []byte("fits")}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "opt.safetensors")
	writeFile(t, path, blobData(2, "opt", 4<<20))
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.c.Save(context.Background(), Snapshot{Round: 2, Streams: map[string]Source{"opt": f}})
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), `blob "opt"`) || !strings.Contains(err.Error(), path) {
		t.Fatalf("full disk: err = %v", err)
	}
	tmpEmpty(t, e)
	e.reopen(t)
	if st := mustLoad(t, e.c); st.Seq != first.Seq {
		t.Fatalf("loaded generation %d after the failed save, want %d", st.Seq, first.Seq)
	}
}

// TestEverySourceIsClosed: sources of snapshots written, superseded by a later SaveAsync
// or a Save, refused, or handed over after Close are each closed exactly once.
func TestEverySourceIsClosed(t *testing.T) {
	e := newEnv(t)
	gate := make(chan struct{})
	var all []*testSource
	src := func(g chan struct{}) map[string]Source {
		s := &testSource{b: []byte("state"), gate: g}
		all = append(all, s)
		return map[string]Source{"s": s}
	}
	e.c.SaveAsync(Snapshot{Round: 1, Streams: src(gate)}) // the writer blocks in it
	e.c.SaveAsync(Snapshot{Round: 2, Streams: src(nil)})  // superseded by 3
	e.c.SaveAsync(Snapshot{Round: 3, Streams: src(nil)})  // superseded by the Save
	third := all[2]
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := e.c.Save(context.Background(), Snapshot{Round: 4, Streams: src(nil)}); err != nil {
			t.Error(err)
		}
	}()
	for third.closed.Load() == 0 { // the Save has queued, dropping round 3
		time.Sleep(time.Millisecond)
	}
	close(gate)
	wg.Wait()
	bad := Snapshot{Round: 5, Streams: src(nil), Keep: map[string]cid.Cid{"s": all[0].cidOf()}}
	if _, err := e.c.Save(context.Background(), bad); err == nil {
		t.Fatal("a snapshot naming a blob twice was saved")
	}
	e.c.Close() // reports the refused save
	e.c.SaveAsync(Snapshot{Round: 6, Streams: src(nil)})
	if _, err := e.c.Save(context.Background(), Snapshot{Round: 7, Streams: src(nil)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("save after close: %v", err)
	}
	for i, s := range all {
		if n := s.closed.Load(); n != 1 {
			t.Errorf("source %d closed %d times, want 1", i, n)
		}
	}
}
