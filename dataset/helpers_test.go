package dataset

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/p2pnode/p2pnode/artifact"
)

// testChunk keeps artifacts multi-chunk with small files.
const testChunk = artifact.MinChunkSize

func fileBytes(name string, n int) []byte {
	var seed uint64
	for _, c := range name {
		seed = seed*31 + uint64(c)
	}
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// writeTree creates files (slash paths → size) under a new directory; content is derived
// from the name so tests can recompute it.
func writeTree(t *testing.T, files map[string]int) string {
	t.Helper()
	dir := t.TempDir()
	for p, n := range files {
		path := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, fileBytes(p, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func openStore(t *testing.T) *artifact.Store {
	t.Helper()
	s, err := artifact.OpenStore(t.TempDir(), artifact.Options{ChunkSize: testChunk})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fakeCID is a valid artifact id for a label (the id of the label's bytes).
func fakeCID(label string) string {
	h, _ := artifact.NewHasher(testChunk)
	h.Write([]byte(label))
	return h.Manifest().ID().String()
}

func mustBuild(t *testing.T, dir string) *Manifest {
	t.Helper()
	m, err := Build(dir, "test", testChunk)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
