package pyruntime

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestEmbeddedPackage(t *testing.T) {
	files := embeddedFiles()
	for _, want := range []string{
		"p2ptrain/__init__.py", "p2ptrain/worker.py", "p2ptrain/safetensors.py", "p2ptrain/command.py",
		"p2ptrain/prepare.py", "p2ptrain/workloads/__init__.py", "p2ptrain/workloads/digits.py",
		"p2ptrain/workloads/charlm.py", "p2ptrain/workloads/bench.py", "p2ptrain/testing/__init__.py",
		"pyproject.toml", "README.md",
	} {
		if !slices.Contains(files, want) {
			t.Errorf("%s is not embedded (have %v)", want, files)
		}
	}
	for _, f := range files {
		if strings.Contains(f, "__pycache__") || !strings.HasSuffix(f, ".py") && f != "pyproject.toml" && f != "README.md" {
			t.Errorf("unexpected embedded file %s", f)
		}
	}
	dir, err := PackageDir()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(dir, EmbeddedHash()[:16]) {
		t.Fatalf("package dir %s is not keyed by the content hash", dir)
	}
	for _, f := range files {
		got, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		src, err := os.ReadFile(filepath.Join("python", f))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(src) {
			t.Errorf("extracted %s differs from the source", f)
		}
	}
	again, err := PackageDir()
	if err != nil || again != dir {
		t.Fatalf("second extraction: %s, %v", again, err)
	}
	// A fresh base directory extracts again.
	d2, err := extractTo(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d2, "p2ptrain", "worker.py")); err != nil {
		t.Fatal(err)
	}
}
