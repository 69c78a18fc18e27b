package pyruntime

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"sync"
)

// The p2ptrain package travels inside the binary. Explicit *.py patterns (not the
// directory) keep __init__.py in and __pycache__ out.
//
//go:embed python/p2ptrain/*.py python/p2ptrain/*/*.py python/pyproject.toml python/README.md
var pythonFS embed.FS

var (
	embedOnce sync.Once
	embedHash string
	extractMu sync.Mutex
)

// EmbeddedHash is the hex sha256 over the embedded p2ptrain files (names and contents).
func EmbeddedHash() string {
	embedOnce.Do(func() {
		h := sha256.New()
		var names []string
		_ = fs.WalkDir(pythonFS, "python", func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				names = append(names, p)
			}
			return err
		})
		sort.Strings(names)
		for _, n := range names {
			b, _ := pythonFS.ReadFile(n)
			fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
			h.Write(b)
		}
		embedHash = hex.EncodeToString(h.Sum(nil))
	})
	return embedHash
}

// PackageDir returns a directory whose p2ptrain/ subdirectory is the embedded package,
// extracting it on first use under the user's cache directory
// ($XDG_CACHE_HOME/p2pnode/python-<hash>, falling back to the temp directory). The
// directory name carries the content hash, so a new binary never runs stale Python and
// concurrent extractions agree.
func PackageDir() (string, error) {
	var errs []error
	for _, base := range cacheBases() {
		dir, err := extractTo(base)
		if err == nil {
			return dir, nil
		}
		errs = append(errs, err)
	}
	return "", fmt.Errorf("pyruntime: extract the p2ptrain package: %v", errs)
}

func cacheBases() []string {
	var bases []string
	if d, err := os.UserCacheDir(); err == nil {
		bases = append(bases, filepath.Join(d, "p2pnode"))
	}
	return append(bases, filepath.Join(os.TempDir(), fmt.Sprintf("p2pnode-%d", os.Getuid())))
}

func extractTo(base string) (string, error) {
	extractMu.Lock()
	defer extractMu.Unlock()
	dir := filepath.Join(base, "python-"+EmbeddedHash()[:16])
	if st, err := os.Stat(filepath.Join(dir, "p2ptrain", "__init__.py")); err == nil && st.Mode().IsRegular() {
		return dir, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(base, ".python-tmp-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp) // after a successful rename there is nothing left to remove
	err = writeEmbedded(tmp)
	if err == nil {
		err = os.Chmod(tmp, 0o755)
	}
	if err != nil {
		return "", fmt.Errorf("extract to %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another process may have won the race; its copy has the same content.
		if _, serr := os.Stat(filepath.Join(dir, "p2ptrain", "__init__.py")); serr == nil {
			return dir, nil
		}
		return "", fmt.Errorf("extract to %s: %w", dir, err)
	}
	return dir, nil
}

// embeddedFiles lists the embedded files relative to the package root (for tests).
func embeddedFiles() []string {
	var out []string
	_ = fs.WalkDir(pythonFS, "python", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, path.Clean(p[len("python/"):]))
		}
		return err
	})
	return out
}
