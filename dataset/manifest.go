package dataset

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/internal/atomicfile"
)

// Version is the manifest format version this package reads and writes.
const Version = 1

// MaxManifestBytes bounds the manifest files we decode (about a million files).
const MaxManifestBytes = 256 << 20

// ErrInvalidManifest is wrapped by every manifest validation error.
var ErrInvalidManifest = errors.New("invalid dataset manifest")

// Manifest lists a dataset's files in the order the planner walks them.
type Manifest struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	Files   []File `json:"files"`
}

// File is one dataset file. CID is its artifact id, so peers can serve and verify it with
// the artifact protocol; Examples is 0 when unknown.
type File struct {
	Path     string `json:"path"`
	Bytes    int64  `json:"bytes"`
	Examples int64  `json:"examples"`
	CID      string `json:"cid"`
}

// Validate checks what every reader relies on: paths that stay inside the dataset
// directory, no file listed twice, and CIDs that are artifact ids.
func (m *Manifest) Validate() error {
	if m.Version != Version {
		return fmt.Errorf("%w: version %d unsupported (want %d)", ErrInvalidManifest, m.Version, Version)
	}
	if m.Name == "" || !utf8.ValidString(m.Name) {
		return fmt.Errorf("%w: name must be non-empty UTF-8", ErrInvalidManifest)
	}
	seen := make(map[string]int, len(m.Files))
	for i, f := range m.Files {
		if err := validPath(f.Path); err != nil {
			return fmt.Errorf("%w: file %d: %w", ErrInvalidManifest, i, err)
		}
		if j, dup := seen[f.Path]; dup {
			return fmt.Errorf("%w: file %q listed twice (entries %d and %d)", ErrInvalidManifest, f.Path, j, i)
		}
		seen[f.Path] = i
		if f.Bytes < 0 || f.Examples < 0 {
			return fmt.Errorf("%w: file %q: negative bytes or examples", ErrInvalidManifest, f.Path)
		}
		if _, err := cids.Parse(f.CID); err != nil {
			return fmt.Errorf("%w: file %q: %w", ErrInvalidManifest, f.Path, err)
		}
	}
	return nil
}

// validPath accepts slash-separated paths relative to the manifest's directory that
// cannot escape it on any OS we run on.
func validPath(p string) error {
	switch {
	case p == "" || p == ".":
		return fmt.Errorf("path %q is empty", p)
	case !utf8.ValidString(p):
		return fmt.Errorf("path %q is not UTF-8", p)
	case strings.ContainsAny(p, "\\\x00"):
		// A backslash is a separator on Windows, where `a\..\..\x` would escape.
		return fmt.Errorf("path %q contains a backslash or NUL", p)
	case !fs.ValidPath(p):
		// Rejects leading '/', '.' and '..' elements, empty elements and trailing '/'.
		return fmt.Errorf("path %q must be relative, clean and stay inside the dataset directory", p)
	}
	return nil
}

// CIDs returns the parsed artifact id of every file, in manifest order.
func (m *Manifest) CIDs() ([]cid.Cid, error) {
	ids := make([]cid.Cid, len(m.Files))
	for i, f := range m.Files {
		c, err := cids.Parse(f.CID)
		if err != nil {
			return nil, fmt.Errorf("dataset file %q: %w", f.Path, err)
		}
		ids[i] = c
	}
	return ids, nil
}

// Canonical returns the manifest's canonical bytes: indented JSON with fields in struct
// order and a final newline. Write stores exactly these bytes, so a manifest we wrote
// hashes to its ID; one edited by hand still has the ID of its canonical form.
func (m *Manifest) Canonical() ([]byte, error) {
	c := *m
	if c.Files == nil {
		c.Files = []File{} // "files": [] rather than null, so both decode to one id
	}
	b, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode dataset manifest %q: %w", m.Name, err)
	}
	return append(b, '\n'), nil
}

// ID is the manifest's id: the raw sha2-256 CID of its canonical bytes. It is raw rather
// than an artifact id so that it does not depend on a chunk size; plans and leases name
// the dataset by it.
func (m *Manifest) ID() (cid.Cid, error) {
	b, err := m.Canonical()
	if err != nil {
		return cid.Undef, err
	}
	return cids.Raw(b), nil
}

// Decode parses and validates manifest JSON. Unknown fields are refused: a field this
// version does not know would be silently dropped from the canonical form and its id.
func Decode(b []byte) (*Manifest, error) {
	if len(b) > MaxManifestBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds %d", ErrInvalidManifest, len(b), MaxManifestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidManifest, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after the JSON object", ErrInvalidManifest)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Load reads and validates the manifest at path.
func Load(path string) (*Manifest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load dataset manifest: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("load dataset manifest %s: %w", path, err)
	}
	m, err := Decode(b)
	if err != nil {
		return nil, fmt.Errorf("load dataset manifest %s: %w", path, err)
	}
	return m, nil
}

// Write validates m and writes its canonical bytes to path atomically.
func (m *Manifest) Write(path string) error {
	if err := m.Validate(); err != nil {
		return fmt.Errorf("write dataset manifest %s: %w", path, err)
	}
	b, err := m.Canonical()
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, b, 0o644); err != nil {
		return fmt.Errorf("write dataset manifest: %w", err)
	}
	return nil
}
