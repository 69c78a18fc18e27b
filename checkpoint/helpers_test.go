package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/cids"
)

// blobData is deterministic content for (round, name), so a reader can recompute what a
// generation must hold. ChaCha8 fills whole buffers at once, which keeps the crash test's
// 1–4 MiB per round cheap even under -race.
func blobData(round uint64, name string, size int) []byte {
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], round)
	copy(seed[8:], name)
	b := make([]byte, size)
	rand.NewChaCha8(seed).Read(b)
	return b
}

type env struct {
	dir    string
	shared *artifact.Store
	c      *Checkpointer
}

func newEnv(t *testing.T) *env {
	t.Helper()
	root := t.TempDir()
	shared, err := artifact.OpenStore(filepath.Join(root, "shared"), artifact.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{dir: filepath.Join(root, "ckpt"), shared: shared}
	e.reopen(t)
	return e
}

// reopen closes the checkpointer (if open) and opens the directory again, as a restart.
func (e *env) reopen(t *testing.T) {
	t.Helper()
	if e.c != nil {
		e.c.Close()
	}
	c, err := Open(e.dir, e.shared, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	t.Cleanup(func() { c.Close() })
}

// snap is a snapshot for round with two large blobs and one kept artifact.
func (e *env) snap(t *testing.T, round uint64) Snapshot {
	t.Helper()
	params, err := e.shared.PutBytes(blobData(round, "params", 3000))
	if err != nil {
		t.Fatal(err)
	}
	return Snapshot{
		Round: round,
		Head:  headOf(round),
		Meta:  map[string]string{"lr": "0.7"},
		Large: map[string][]byte{
			"momentum": blobData(round, "momentum", 100_000),
			"residual": blobData(round, "residual", 5_000),
		},
		Keep: map[string]cid.Cid{"params": params},
	}
}

func headOf(round uint64) string {
	return cids.Raw([]byte{byte(round), byte(round >> 8)}).String()
}

func (e *env) save(t *testing.T, round uint64) *State {
	t.Helper()
	st, err := e.c.Save(context.Background(), e.snap(t, round))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// checkRound asserts st is exactly what e.snap(round) saved.
func (e *env) checkRound(t *testing.T, st *State, round uint64) {
	t.Helper()
	if st.Round != round || st.Head != headOf(round) || st.Meta["lr"] != "0.7" {
		t.Fatalf("state has round %d head %s meta %v, want round %d", st.Round, st.Head, st.Meta, round)
	}
	want := map[string][]byte{
		"momentum": blobData(round, "momentum", 100_000),
		"residual": blobData(round, "residual", 5_000),
		"params":   blobData(round, "params", 3000),
	}
	for name, data := range want {
		b, err := e.c.OpenBlob(st, name)
		if err != nil {
			t.Fatal(err)
		}
		ok := bytes.Equal(b.Bytes(), data)
		b.Close()
		if !ok {
			t.Fatalf("round %d: blob %q differs from what was saved", round, name)
		}
	}
}

func (e *env) stateFiles(t *testing.T) []uint64 {
	t.Helper()
	seqs, err := e.c.listSeqs()
	if err != nil {
		t.Fatal(err)
	}
	return seqs
}

func mustLoad(t *testing.T, c *Checkpointer) *State {
	t.Helper()
	st, err := c.Load()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// makeWritable lets tests damage the store's read-only files even when not run as root.
func makeWritable(t *testing.T, path string) {
	t.Helper()
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
}
