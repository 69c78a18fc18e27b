package pyruntime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// ErrProtocolMismatch: the p2ptrain package the interpreter imports speaks no worker
// protocol version this node speaks; the error says which copy it is and how to fix it.
var ErrProtocolMismatch = errors.New("worker protocol version mismatch")

// p2ptrainSource is the copy of p2ptrain a Python process of this node imports: a
// p2ptrain installed for the interpreter (pip install ./pyruntime/python, or
// `p2pnode python-package`) wins; without one, the copy embedded in the binary is
// extracted and put on PYTHONPATH, so that a bare machine needs no setup.
type p2ptrainSource struct {
	// Dir goes first on PYTHONPATH: the embedded copy's directory (or Options.PackageDir);
	// "" when the installed package is used.
	Dir string
	// Installed is the installed package's directory and Version its distribution version,
	// when the interpreter has one and it is used.
	Installed, Version string
}

func (s p2ptrainSource) String() string {
	if s.Installed != "" {
		return fmt.Sprintf("p2ptrain %s installed at %s", orUnknown(s.Version), s.Installed)
	}
	return fmt.Sprintf("p2ptrain %s embedded in this node (extracted to %s)", EmbeddedVersion(), s.Dir)
}

func orUnknown(s string) string {
	if s == "" {
		return "(version unknown)"
	}
	return s
}

// findInstalledScript prints the directory and distribution version of the p2ptrain the
// interpreter would import, without importing it (which would import torch), or nothing.
const findInstalledScript = `import importlib.util, os, sys
s = importlib.util.find_spec("p2ptrain")
if s is None:
    sys.exit(0)
loc = os.path.dirname(s.origin) if s.origin else list(s.submodule_search_locations or [""])[0]
try:
    from importlib.metadata import version
    v = version("p2ptrain")
except Exception:
    v = ""
print(os.path.abspath(loc))
print(v)
`

// resolvePackage picks the p2ptrain that o's Python processes import (see p2ptrainSource).
// Options.PackageDir, when set, is used as given.
func resolvePackage(ctx context.Context, o Options) (p2ptrainSource, error) {
	if o.PackageDir != "" {
		if _, err := os.Stat(filepath.Join(o.PackageDir, "p2ptrain", "__init__.py")); err != nil {
			return p2ptrainSource{}, fmt.Errorf("pyruntime: option PackageDir %s: no p2ptrain package there: %w", o.PackageDir, err)
		}
		return p2ptrainSource{Dir: o.PackageDir}, nil
	}
	if dir, version, err := findInstalled(ctx, o); err != nil {
		o.Logger.Debug("could not look for an installed p2ptrain; using the embedded copy", "interpreter", o.Interpreter, "err", err)
	} else if dir != "" {
		return p2ptrainSource{Installed: dir, Version: version}, nil
	}
	dir, err := PackageDir()
	if err != nil {
		return p2ptrainSource{}, err
	}
	return p2ptrainSource{Dir: dir}, nil
}

// findInstalled asks the interpreter, with the node's Python path and environment but not
// the embedded copy, where it would import p2ptrain from.
func findInstalled(ctx context.Context, o Options) (dir, version string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, o.Interpreter, "-c", findInstalledScript)
	cmd.Env = o.pythonEnv("", nil)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Errorf("%s: %w: %s", o.Interpreter, err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) == 0 || lines[0] == "" {
		return "", "", nil
	}
	if len(lines) > 1 {
		version = strings.TrimSpace(lines[1])
	}
	return strings.TrimSpace(lines[0]), version, nil
}

// mismatchError explains a failed version negotiation: which p2ptrain the worker ran, what
// each side speaks, and the two ways out.
func mismatchError(o Options, src p2ptrainSource, cause error) error {
	if src.Installed == "" {
		return fmt.Errorf("%w: %s (%w); this node speaks %v: %s", ErrProtocolMismatch, src, cause, o.versions,
			"the p2ptrain package directory does not match this p2pnode binary")
	}
	return fmt.Errorf("%w: interpreter %s imports %s, which does not speak this node's worker protocol %v (%w); "+
		"this node (p2pnode with embedded p2ptrain %s) needs the matching package: run "+
		"`p2pnode python-package --out DIR && %s -m pip install --no-build-isolation --no-deps --no-index DIR`, "+
		"or `%s -m pip uninstall p2ptrain` to use the copy embedded in the node",
		ErrProtocolMismatch, o.Interpreter, src, o.versions, cause, EmbeddedVersion(), o.Interpreter, o.Interpreter)
}

var versionLine = regexp.MustCompile(`(?m)^__version__\s*=\s*["']([^"']+)["']`)

// EmbeddedVersion is the __version__ of the p2ptrain package embedded in the binary.
var EmbeddedVersion = sync.OnceValue(func() string {
	b, err := pythonFS.ReadFile("python/p2ptrain/__init__.py")
	if err != nil {
		return "unknown"
	}
	if m := versionLine.FindSubmatch(b); m != nil {
		return string(m[1])
	}
	return "unknown"
})

// WritePackage writes the embedded p2ptrain source tree (the package, pyproject.toml and
// README.md) into dir, ready for `pip install --no-build-isolation --no-deps DIR`. It
// refuses a dir that already holds a p2ptrain package rather than mixing two versions.
func WritePackage(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "p2ptrain")); err == nil {
		return fmt.Errorf("write p2ptrain package to %s: it already has a p2ptrain directory", dir)
	}
	if err := writeEmbedded(dir); err != nil {
		return fmt.Errorf("write p2ptrain package to %s: %w", dir, err)
	}
	return nil
}

// writeEmbedded copies the embedded tree (rooted at python/) into dir.
func writeEmbedded(dir string) error {
	return fs.WalkDir(pythonFS, "python", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		target := filepath.Join(dir, filepath.FromSlash(p[len("python"):]))
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := pythonFS.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}
