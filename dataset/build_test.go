package dataset

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestBuild(t *testing.T) {
	dir := writeTree(t, map[string]int{
		"a.txt":             3*testChunk + 7,
		"a/b":               10,
		"z/y/x.npz":         0,
		"b.npz":             testChunk,
		".hidden":           5,
		".git/objects/aa":   5,
		"sub/.cache":        5,
		"manifest.json":     5, // reserved names in the root are skipped...
		"examples.json":     0, // (overwritten below)
		"sub/manifest.json": 4, // ...but not below it
	})
	if err := os.WriteFile(filepath.Join(dir, "examples.json"), []byte(`{"a.txt": 64, "b.npz": 3}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "b.npz"), filepath.Join(dir, "link.npz")); err != nil {
		t.Fatal(err)
	}

	m := mustBuild(t, dir)

	wantPaths := []string{"a.txt", "a/b", "b.npz", "link.npz", "sub/manifest.json", "z/y/x.npz"}
	var got []string
	for _, f := range m.Files {
		got = append(got, f.Path)
	}
	if strings.Join(got, ",") != strings.Join(wantPaths, ",") {
		t.Fatalf("paths %v, want %v", got, wantPaths)
	}
	// Every CID is what the artifact store assigns the same bytes.
	s := openStore(t)
	for _, f := range m.Files {
		id, err := s.PutFile(filepath.Join(dir, filepath.FromSlash(f.Path)))
		if err != nil {
			t.Fatal(err)
		}
		if id.String() != f.CID {
			t.Errorf("%s: manifest cid %s, store id %s", f.Path, f.CID, id)
		}
		st, _ := os.Stat(filepath.Join(dir, filepath.FromSlash(f.Path)))
		if st.Size() != f.Bytes {
			t.Errorf("%s: bytes %d, want %d", f.Path, f.Bytes, st.Size())
		}
	}
	wantExamples := map[string]int64{"a.txt": 64, "b.npz": 3}
	for _, f := range m.Files {
		if f.Examples != wantExamples[f.Path] {
			t.Errorf("%s: examples %d, want %d", f.Path, f.Examples, wantExamples[f.Path])
		}
	}

	// Deterministic: a second build of the same tree gives the same id.
	again := mustBuild(t, dir)
	a, _ := m.ID()
	b, _ := again.ID()
	if !a.Equals(b) {
		t.Fatal("two builds of one tree differ")
	}
}

func TestBuildErrors(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, dir string)
		chunk   int
		wantErr string
	}{
		{"empty directory", func(*testing.T, string) {}, testChunk, "no data files"},
		{"only hidden files", func(t *testing.T, dir string) { write(t, dir, ".x", "1") }, testChunk, "no data files"},
		{"examples names a missing file", func(t *testing.T, dir string) {
			write(t, dir, "a", "1")
			write(t, dir, "examples.json", `{"b": 1}`)
		}, testChunk, `names "b"`},
		{"negative examples", func(t *testing.T, dir string) {
			write(t, dir, "a", "1")
			write(t, dir, "examples.json", `{"a": -1}`)
		}, testChunk, "negative"},
		{"malformed examples", func(t *testing.T, dir string) {
			write(t, dir, "a", "1")
			write(t, dir, "examples.json", `[1]`)
		}, testChunk, "decode examples.json"},
		{"fifo", func(t *testing.T, dir string) {
			write(t, dir, "a", "1")
			if err := syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644); err != nil {
				t.Skip("mkfifo:", err)
			}
		}, testChunk, "not a regular file"},
		{"symlinked directory", func(t *testing.T, dir string) {
			write(t, dir, "d/a", "1")
			if err := os.Symlink(filepath.Join(dir, "d"), filepath.Join(dir, "e")); err != nil {
				t.Fatal(err)
			}
		}, testChunk, "symlinked directories"},
		{"dangling symlink", func(t *testing.T, dir string) {
			if err := os.Symlink(filepath.Join(dir, "gone"), filepath.Join(dir, "e")); err != nil {
				t.Fatal(err)
			}
		}, testChunk, "dataset file e"},
		{"backslash in a name", func(t *testing.T, dir string) { write(t, dir, `a\b`, "1") }, testChunk, "backslash"},
		{"bad chunk size", func(t *testing.T, dir string) { write(t, dir, "a", "1") }, 5, "chunk size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.setup(t, dir)
			_, err := Build(dir, "x", tt.chunk)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func write(t *testing.T, dir, rel, content string) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
