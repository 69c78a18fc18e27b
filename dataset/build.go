package dataset

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/p2pnode/p2pnode/artifact"
)

// Names Build reserves in the dataset directory's root.
const (
	ManifestFile = "manifest.json"
	ExamplesFile = "examples.json"
)

// maxExamplesBytes bounds the examples.json sidecar.
const maxExamplesBytes = 64 << 20

// Build hashes every file under dir into a manifest named name. Files are listed in byte
// order of their slash-separated relative paths, so the same tree always gives the same
// manifest. Hidden files and directories (".name") and the root's manifest.json and
// examples.json are skipped; symlinks to regular files are followed, anything else that
// is not a regular file or directory is an error rather than silently left out.
//
// Each file's CID is its artifact id at chunkSize (0 means artifact.DefaultChunkSize); it
// must equal the chunk size of the artifact stores that will serve the files, since the
// id depends on it. Example counts come from the optional examples.json sidecar.
func Build(dir, name string, chunkSize int) (*Manifest, error) {
	if _, err := artifact.NewHasher(chunkSize); err != nil {
		return nil, fmt.Errorf("build dataset %s: %w", dir, err)
	}
	paths, err := listFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("build dataset %s: %w", dir, err)
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("build dataset %s: no data files", dir)
	}
	examples, err := readExamples(filepath.Join(dir, ExamplesFile), paths)
	if err != nil {
		return nil, fmt.Errorf("build dataset %s: %w", dir, err)
	}
	m := &Manifest{Version: Version, Name: name, Files: make([]File, len(paths))}
	for i, p := range paths {
		am, err := hashFile(filepath.Join(dir, filepath.FromSlash(p)), chunkSize)
		if err != nil {
			return nil, fmt.Errorf("build dataset %s: %w", dir, err)
		}
		m.Files[i] = File{Path: p, Bytes: int64(am.Size), Examples: examples[p], CID: am.ID().String()}
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("build dataset %s: %w", dir, err)
	}
	return m, nil
}

// listFiles returns the sorted slash-separated paths of the data files under dir.
func listFiles(dir string) ([]string, error) {
	var paths []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if rel == ManifestFile || rel == ExamplesFile {
			return nil
		}
		mode := d.Type()
		if mode&fs.ModeSymlink != 0 {
			st, err := os.Stat(path) // follow it
			if err != nil {
				return fmt.Errorf("dataset file %s: %w", rel, err)
			}
			mode = st.Mode().Type()
			if mode.IsDir() {
				return fmt.Errorf("dataset file %s: symlinked directories are not followed", rel)
			}
		}
		switch {
		case d.IsDir():
			return nil
		case !mode.IsRegular():
			return fmt.Errorf("dataset file %s: not a regular file (%s)", rel, mode)
		}
		if err := validPath(rel); err != nil {
			return fmt.Errorf("dataset file %s: %w", rel, err)
		}
		paths = append(paths, rel)
		return nil
	})
	if err != nil {
		return nil, err
	}
	// WalkDir's per-directory order puts "a/b" before "a.txt"; sort whole paths instead so
	// the order is a simple rule anyone can reproduce.
	sort.Strings(paths)
	return paths, nil
}

// readExamples reads the optional sidecar mapping path → example count. A path it names
// that is not a data file is an error: it is most likely a typo that would leave a count 0.
func readExamples(path string, files []string) (map[string]int64, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]int64{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", ExamplesFile, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxExamplesBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", ExamplesFile, err)
	}
	if len(b) > maxExamplesBytes {
		return nil, fmt.Errorf("read %s: larger than %d bytes", ExamplesFile, maxExamplesBytes)
	}
	var ex map[string]int64
	if err := json.Unmarshal(b, &ex); err != nil {
		return nil, fmt.Errorf("decode %s: %w", ExamplesFile, err)
	}
	known := make(map[string]bool, len(files))
	for _, p := range files {
		known[p] = true
	}
	for p, n := range ex {
		if !known[p] {
			return nil, fmt.Errorf("%s names %q, which is not a data file", ExamplesFile, p)
		}
		if n < 0 {
			return nil, fmt.Errorf("%s: %q has negative count %d", ExamplesFile, p, n)
		}
	}
	return ex, nil
}

func hashFile(path string, chunkSize int) (*artifact.Manifest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("hash dataset file: %w", err)
	}
	defer f.Close()
	m, err := artifact.ManifestOf(f, chunkSize)
	if err != nil {
		return nil, fmt.Errorf("hash dataset file %s: %w", path, err)
	}
	return m, nil
}
