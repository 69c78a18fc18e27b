package artifact

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/cids"
)

// Hasher computes an artifact's manifest from its bytes without storing them, so that a
// caller can learn (or check) an artifact id before, or instead of, writing it to a store.
// Store writers use it too, so stored and computed ids always agree.
type Hasher struct {
	chunkSize uint64
	chunk     []byte
	chunks    []cid.Cid
	size      uint64
}

// NewHasher returns a Hasher for chunkSize (0 means DefaultChunkSize).
func NewHasher(chunkSize int) (*Hasher, error) {
	cs := uint64(chunkSize)
	if chunkSize == 0 {
		cs = DefaultChunkSize
	}
	if chunkSize < 0 || cs < MinChunkSize || cs > MaxChunkSize {
		return nil, fmt.Errorf("hash artifact: chunk size %d outside [%d, %d]", chunkSize, MinChunkSize, MaxChunkSize)
	}
	return &Hasher{chunkSize: cs}, nil
}

// Write hashes p; it never fails.
func (h *Hasher) Write(p []byte) (int, error) {
	n := len(p)
	h.size += uint64(n)
	for len(p) > 0 {
		take := min(len(p), int(h.chunkSize)-len(h.chunk))
		// A whole chunk available in p is hashed in place rather than copied.
		if len(h.chunk) == 0 && take == int(h.chunkSize) {
			h.chunks = append(h.chunks, ChunkCID(p[:take]))
		} else {
			if h.chunk == nil {
				h.chunk = make([]byte, 0, h.chunkSize)
			}
			h.chunk = append(h.chunk, p[:take]...)
			if len(h.chunk) == int(h.chunkSize) {
				h.chunks = append(h.chunks, ChunkCID(h.chunk))
				h.chunk = h.chunk[:0]
			}
		}
		p = p[take:]
	}
	return n, nil
}

// Manifest returns the manifest of the bytes written so far. The Hasher stays usable:
// the partial last chunk is hashed but not consumed.
func (h *Hasher) Manifest() *Manifest {
	chunks := make([]cid.Cid, len(h.chunks), len(h.chunks)+1)
	copy(chunks, h.chunks)
	if len(h.chunk) > 0 {
		chunks = append(chunks, ChunkCID(h.chunk))
	}
	return &Manifest{Version: ManifestVersion, Size: h.size, ChunkSize: h.chunkSize, Chunks: chunks}
}

// ManifestOf reads r to the end and returns the manifest its bytes would have as an
// artifact chunked at chunkSize (0 means DefaultChunkSize).
func ManifestOf(r io.Reader, chunkSize int) (*Manifest, error) {
	h, err := NewHasher(chunkSize)
	if err != nil {
		return nil, err
	}
	// A chunk-sized buffer lets Write hash whole chunks without copying them.
	buf := make([]byte, h.chunkSize)
	if _, err := io.CopyBuffer(h, onlyReader{r}, buf); err != nil {
		return nil, fmt.Errorf("hash artifact: %w", err)
	}
	return h.Manifest(), nil
}

// onlyReader hides WriterTo so io.CopyBuffer really uses the buffer it is given.
type onlyReader struct{ io.Reader }

// PutVerified stores the bytes read from r only if they form the artifact want: they are
// copied to a temporary file while being hashed at the store's chunk size, and installed
// under want when the ids match. On a mismatch nothing is stored and the error wraps
// ErrCorrupt naming both ids. If the store already holds want, r is not read.
func (s *Store) PutVerified(r io.Reader, want cid.Cid) error {
	if err := cids.Check(want, cids.CodecCBOR); err != nil {
		return fmt.Errorf("store artifact %s: %w", want, err)
	}
	if s.Has(want) {
		return nil
	}
	f, err := os.CreateTemp(filepath.Join(s.dir, "tmp"), "verify-*")
	if err != nil {
		return fmt.Errorf("store artifact %s: %w", want, err)
	}
	committed := false
	defer func() {
		if !committed {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h, err := NewHasher(int(s.chunkSize))
	if err != nil {
		return err
	}
	buf := make([]byte, s.chunkSize)
	if _, err := io.CopyBuffer(io.MultiWriter(f, h), onlyReader{r}, buf); err != nil {
		return fmt.Errorf("store artifact %s: %w", want, err)
	}
	m := h.Manifest()
	if got := m.ID(); !got.Equals(want) {
		return fmt.Errorf("%w: bytes form artifact %s (chunk size %d), expected %s", ErrCorrupt, got, s.chunkSize, want)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("store artifact %s: sync: %w", want, err)
	}
	if err := f.Chmod(0o444); err != nil {
		return fmt.Errorf("store artifact %s: %w", want, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("store artifact %s: %w", want, err)
	}
	committed = true
	if err := s.install(want, f.Name(), m.Encode()); err != nil {
		os.Remove(f.Name())
		return err
	}
	// install leaves the temporary file behind when another writer got there first.
	os.Remove(f.Name())
	return nil
}
