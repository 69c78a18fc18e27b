package export

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/p2pnode/p2pnode/pack"
)

// ErrNoModel is returned when a directory holds neither model.safetensors nor an index.
var ErrNoModel = errors.New("no model in directory")

// ErrLayoutMismatch is returned when an in-place sync finds a model whose layout differs
// from the export's (tensor names, dtypes, shapes, offsets, shard assignment or header
// length). Nothing is written then.
var ErrLayoutMismatch = errors.New("model layout differs")

// existingFile is one safetensors file found in the model directory.
type existingFile struct {
	name   string
	size   int64
	header *pack.Header
}

// existingModel is the model a directory holds.
type existingModel struct {
	dir       string
	index     *modelIndex // nil for a single file
	indexRaw  []byte
	files     map[string]*existingFile
	fileNames []string // sorted
}

// readExisting reads the model in dir: its index (if sharded) and every file's header.
// It returns ErrNoModel when there is none; any file that is not valid safetensors is an
// error naming it.
func readExisting(dir string) (*existingModel, error) {
	m := &existingModel{dir: dir, files: map[string]*existingFile{}}
	idxPath := filepath.Join(dir, IndexFile)
	raw, err := readSmall(idxPath, maxIndexBytes)
	switch {
	case err == nil:
		idx, err := parseIndex(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", idxPath, err)
		}
		m.index, m.indexRaw, m.fileNames = idx, raw, idx.files
	case errors.Is(err, fs.ErrNotExist):
		if _, err := os.Stat(filepath.Join(dir, SingleFile)); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("%w: %s has neither %s nor %s", ErrNoModel, dir, SingleFile, IndexFile)
			}
			return nil, fmt.Errorf("model directory %s: %w", dir, err)
		}
		m.fileNames = []string{SingleFile}
	default:
		return nil, err
	}
	for _, name := range m.fileNames {
		f, err := readFileHeader(filepath.Join(dir, name))
		if err != nil {
			if m.index != nil && errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("%s names %s, which is missing: %w", idxPath, name, err)
			}
			return nil, err
		}
		f.name = name
		m.files[name] = f
	}
	if m.index != nil {
		for _, tensor := range sortedKeys(m.index.weightMap) {
			file := m.index.weightMap[tensor]
			if _, ok := m.files[file].header.Find(tensor); !ok {
				return nil, fmt.Errorf("%w: %s maps tensor %q to %s, which does not hold it", ErrBadIndex, idxPath, tensor, file)
			}
		}
	}
	return m, nil
}

// readSmall reads a whole file of at most limit bytes.
func readSmall(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}

// readFileHeader parses a safetensors file's header without reading its data, checking
// every tensor lies within the file (a truncated file fails here).
func readFileHeader(path string) (*existingFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	prefix := make([]byte, 8)
	if _, err := io.ReadFull(f, prefix); err != nil {
		return nil, fmt.Errorf("%s: %w: %d bytes, too short for safetensors", path, pack.ErrMalformed, st.Size())
	}
	n, err := pack.ReadHeaderLen(prefix, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	buf := make([]byte, 8+n)
	copy(buf, prefix)
	if _, err := io.ReadFull(f, buf[8:]); err != nil {
		return nil, fmt.Errorf("read header of %s: %w", path, err)
	}
	h, err := pack.ParseHeader(buf, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &existingFile{size: st.Size(), header: h}, nil
}

// checkSameLayout returns ErrLayoutMismatch naming the first file and tensor where the
// model in the directory differs from the plan, so that nothing is written to it.
func (m *existingModel) checkSameLayout(p *plan) error {
	mismatch := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s; export without --in-place to replace it", ErrLayoutMismatch, fmt.Sprintf(format, args...))
	}
	idxPath := filepath.Join(m.dir, IndexFile)
	switch {
	case p.index == nil && m.index != nil:
		return mismatch("%s is sharded (%s), the export is one file (%s)", m.dir, IndexFile, SingleFile)
	case p.index != nil && m.index == nil:
		return mismatch("%s holds one file (%s), the export has %d shards", m.dir, SingleFile, len(p.files))
	case p.index != nil:
		want := p.weightMap()
		for _, name := range sortedKeys(want) {
			got, ok := m.index.weightMap[name]
			if !ok {
				return mismatch("%s has no entry for tensor %q", idxPath, name)
			}
			if got != want[name] {
				return mismatch("%s puts tensor %q in %s, the export in %s", idxPath, name, got, want[name])
			}
		}
		for _, name := range sortedKeys(m.index.weightMap) {
			if _, ok := want[name]; !ok {
				return mismatch("%s names tensor %q, which the export does not have", idxPath, name)
			}
		}
	}
	for i := range p.files {
		fp := &p.files[i]
		path := filepath.Join(m.dir, fp.name)
		ef, ok := m.files[fp.name]
		if !ok {
			return mismatch("%s is missing", path)
		}
		for _, t := range fp.tensors {
			got, ok := ef.header.Find(t.Name)
			if !ok {
				return mismatch("%s has no tensor %q", path, t.Name)
			}
			if got.DType != t.DType || !slices.Equal(got.Shape, t.Shape) || got.Begin != t.Begin || got.End != t.End {
				return mismatch("%s: tensor %q is %s%v at [%d, %d], the export's %s%v at [%d, %d]",
					path, t.Name, got.DType, got.Shape, got.Begin, got.End, t.DType, t.Shape, t.Begin, t.End)
			}
		}
		if len(ef.header.Tensors) != len(fp.tensors) {
			for _, t := range ef.header.Tensors {
				if !slices.ContainsFunc(fp.tensors, func(x pack.TensorInfo) bool { return x.Name == t.Name }) {
					return mismatch("%s holds tensor %q, which the export does not have", path, t.Name)
				}
			}
		}
		// Checked after the tensors, so that a changed tensor (which also changes the
		// header's length) is named.
		if ef.header.DataStart != int64(len(fp.header)) {
			return mismatch("%s has a %d-byte header, the export %d bytes (another experiment or exporter?)", path, ef.header.DataStart, len(fp.header))
		}
		if ef.size != fp.size() {
			return mismatch("%s is %d bytes, the export %d", path, ef.size, fp.size())
		}
	}
	return nil
}

// indexUnchanged reports whether the directory's index bytes are the planned ones.
func (m *existingModel) indexUnchanged(p *plan) bool {
	return p.index != nil && bytes.Equal(m.indexRaw, p.index)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
