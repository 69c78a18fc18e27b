package pyruntime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// installedCopy writes the embedded package into a fresh directory, as `p2pnode
// python-package` does, optionally editing worker.py, and returns the directory.
func installedCopy(t *testing.T, edit func(worker string) string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "site")
	if err := WritePackage(dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"pyproject.toml", "README.md", "p2ptrain/__init__.py", "p2ptrain/workloads/digits.py"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("WritePackage left out %s: %v", f, err)
		}
	}
	if err := WritePackage(dir); err == nil {
		t.Fatal("WritePackage wrote over an existing p2ptrain directory")
	}
	if edit != nil {
		path := filepath.Join(dir, "p2ptrain", "worker.py")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(edit(string(b))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A p2ptrain the interpreter can import (here through the Python path, as a pip install
// would make it importable) is used instead of the embedded copy.
func TestWorkerUsesAnInstalledP2PTrain(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	site := installedCopy(t, nil)
	opts, _ := baseOptions(t, tinyFactory, nil)
	opts.PythonPath = []string{site}
	_, info := startWorker(t, opts)
	want := "installed at " + filepath.Join(site, "p2ptrain")
	if !strings.Contains(info.P2PTrain, want) {
		t.Fatalf("worker runs %q, want the copy %s", info.P2PTrain, want)
	}

	opts, _ = baseOptions(t, tinyFactory, nil)
	_, info = startWorker(t, opts)
	if !strings.Contains(info.P2PTrain, "embedded") {
		t.Fatalf("without an installed copy the worker runs %q, want the embedded copy", info.P2PTrain)
	}
}

// An installed p2ptrain that speaks another protocol version fails start-up with an error
// naming the copy, both versions, and the two fixes.
func TestInstalledP2PTrainOfAnotherProtocolVersionIsExplained(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	site := installedCopy(t, func(worker string) string {
		return strings.Replace(worker, "PROTOCOL_VERSIONS = (1,)", "PROTOCOL_VERSIONS = (99,)", 1)
	})
	opts, _ := baseOptions(t, tinyFactory, nil)
	opts.PythonPath = []string{site}
	w, err := NewWorker(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_, err = w.Start(context.Background())
	if !errors.Is(err, ErrProtocolMismatch) {
		t.Fatalf("want ErrProtocolMismatch, got %v", err)
	}
	for _, want := range []string{filepath.Join(site, "p2ptrain"), "[1]", "speaks [99]", "p2pnode python-package", "pip uninstall p2ptrain"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q:\n%v", want, err)
		}
	}
}
