package artifact

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/internal/atomicfile"
)

// ErrNotFound is returned for an artifact the store does not hold.
var ErrNotFound = errors.New("artifact not found")

// Store is a directory of complete artifacts:
//
//	manifests/<id>   the manifest bytes
//	blobs/<id>       the artifact's bytes, read-only (0444)
//	tmp/             files being written
//
// A blob is renamed into place only after it is fully written and fsynced, and the
// manifest is written after the blob, so a crash leaves either a whole artifact or none.
type Store struct {
	dir       string
	chunkSize uint64
	mu        sync.Mutex // serialises commits and removals

	// committed holds the ids committed (or committed again: bytes the store already
	// held) since the last TakeCommitted, while tracking is on; nil when it is off.
	// Guarded by mu.
	committed map[cid.Cid]struct{}
}

// Options configure a store.
type Options struct {
	// ChunkSize for artifacts created here (default 1 MiB).
	ChunkSize int
	// LeaveTemps opens the store beside a node that may be running on it (commands that
	// only read: audit, export, verify): its temporary files may be that node's writes in
	// progress, so they are not removed.
	LeaveTemps bool
}

// OpenStore opens (creating if needed) the store rooted at dir.
func OpenStore(dir string, opts Options) (*Store, error) {
	cs := uint64(opts.ChunkSize)
	if cs == 0 {
		cs = DefaultChunkSize
	}
	if cs < MinChunkSize || cs > MaxChunkSize {
		return nil, fmt.Errorf("open artifact store %s: chunk size %d outside [%d, %d]", dir, cs, MinChunkSize, MaxChunkSize)
	}
	for _, sub := range []string{"manifests", "blobs", "tmp", "partial"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("open artifact store %s: %w", dir, err)
		}
	}
	if opts.LeaveTemps {
		return &Store{dir: dir, chunkSize: cs}, nil
	}
	// Left-over temporary files belong to writes that never committed: whole artifacts
	// in tmp/, manifests being renamed into manifests/ and partial/.
	if ents, err := os.ReadDir(filepath.Join(dir, "tmp")); err == nil {
		for _, e := range ents {
			os.Remove(filepath.Join(dir, "tmp", e.Name()))
		}
	}
	for _, sub := range []string{"manifests", "partial"} {
		if _, err := atomicfile.RemoveTemps(filepath.Join(dir, sub)); err != nil {
			return nil, fmt.Errorf("open artifact store %s: %w", dir, err)
		}
	}
	return &Store{dir: dir, chunkSize: cs}, nil
}

// Dir is the store's root directory.
func (s *Store) Dir() string { return s.dir }

// ChunkSize is the chunk size used for new artifacts.
func (s *Store) ChunkSize() int { return int(s.chunkSize) }

// BlobPath is the path of a complete artifact's bytes (read-only file).
func (s *Store) BlobPath(id cid.Cid) string { return filepath.Join(s.dir, "blobs", id.String()) }

func (s *Store) manifestPath(id cid.Cid) string {
	return filepath.Join(s.dir, "manifests", id.String())
}

// Has reports whether the store holds the complete artifact.
func (s *Store) Has(id cid.Cid) bool {
	_, err := os.Stat(s.manifestPath(id))
	return err == nil
}

// Manifest reads an artifact's manifest, verifying it against id.
func (s *Store) Manifest(id cid.Cid) (*Manifest, error) {
	b, err := os.ReadFile(s.manifestPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", id, err)
	}
	m, err := DecodeManifest(b, id)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", id, err)
	}
	return m, nil
}

// ManifestBytes returns the stored manifest encoding (for serving it to peers).
func (s *Store) ManifestBytes(id cid.Cid) ([]byte, error) {
	b, err := os.ReadFile(s.manifestPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return b, err
}

// Create starts a new artifact; write its bytes, then Commit (or Abort).
func (s *Store) Create() (*Writer, error) {
	h, err := NewHasher(int(s.chunkSize))
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Join(s.dir, "tmp"), "new-*")
	if err != nil {
		return nil, fmt.Errorf("create artifact: %w", err)
	}
	return &Writer{s: s, f: f, h: h}, nil
}

// Writer hashes chunks as bytes are written and commits the artifact under its CID.
type Writer struct {
	s   *Store
	f   *os.File
	h   *Hasher
	err error
}

// Write appends bytes to the artifact.
func (w *Writer) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if _, err := w.f.Write(p); err != nil {
		w.err = fmt.Errorf("write artifact: %w", err)
		return 0, w.err
	}
	return w.h.Write(p)
}

// Commit finishes the artifact, makes it durable and returns its id. Committing bytes the
// store already holds is not an error.
func (w *Writer) Commit() (cid.Cid, error) {
	defer w.Abort()
	if w.err != nil {
		return cid.Undef, w.err
	}
	m := w.h.Manifest()
	id := m.ID()
	if err := w.f.Sync(); err != nil {
		return cid.Undef, fmt.Errorf("commit artifact %s: sync: %w", id, err)
	}
	if err := w.f.Chmod(0o444); err != nil {
		return cid.Undef, fmt.Errorf("commit artifact %s: %w", id, err)
	}
	if err := w.f.Close(); err != nil {
		return cid.Undef, fmt.Errorf("commit artifact %s: %w", id, err)
	}
	if err := w.s.install(id, w.f.Name(), m.Encode()); err != nil {
		return cid.Undef, err
	}
	return id, nil
}

// Abort discards an uncommitted artifact. It is a no-op after Commit.
func (w *Writer) Abort() {
	if w.f != nil {
		w.f.Close()
		os.Remove(w.f.Name())
		w.f = nil
	}
}

// install moves a complete, synced blob into place and writes its manifest.
func (s *Store) install(id cid.Cid, blobTmp string, manifest []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.committed != nil {
		s.committed[id] = struct{}{}
	}
	if s.Has(id) {
		return nil
	}
	if err := os.Rename(blobTmp, s.BlobPath(id)); err != nil {
		return fmt.Errorf("commit artifact %s: %w", id, err)
	}
	if err := atomicfile.SyncDir(filepath.Join(s.dir, "blobs")); err != nil {
		return fmt.Errorf("commit artifact %s: %w", id, err)
	}
	if err := atomicfile.Write(s.manifestPath(id), manifest, 0o444); err != nil {
		return fmt.Errorf("commit artifact %s: %w", id, err)
	}
	return nil
}

// PutBytes stores b and returns its artifact id.
func (s *Store) PutBytes(b []byte) (cid.Cid, error) {
	w, err := s.Create()
	if err != nil {
		return cid.Undef, err
	}
	if _, err := w.Write(b); err != nil {
		w.Abort()
		return cid.Undef, err
	}
	return w.Commit()
}

// PutFile copies a file into the store and returns its artifact id.
func (s *Store) PutFile(path string) (cid.Cid, error) {
	f, err := os.Open(path)
	if err != nil {
		return cid.Undef, fmt.Errorf("store file %s: %w", path, err)
	}
	defer f.Close()
	w, err := s.Create()
	if err != nil {
		return cid.Undef, err
	}
	if _, err := io.Copy(w, f); err != nil {
		w.Abort()
		return cid.Undef, fmt.Errorf("store file %s: %w", path, err)
	}
	return w.Commit()
}

// Blob is a read-only mapped view of an artifact's bytes.
type Blob struct {
	data []byte
}

// Bytes is the artifact's content; valid until Close.
func (b *Blob) Bytes() []byte { return b.data }

// Close unmaps the blob.
func (b *Blob) Close() error {
	if b == nil || len(b.data) == 0 {
		return nil
	}
	err := syscall.Munmap(b.data)
	b.data = nil
	return err
}

// Open maps a complete artifact read-only. The bytes are those that were verified when the
// artifact entered the store; call Verify to re-check them against the manifest.
func (s *Store) Open(id cid.Cid) (*Blob, error) {
	m, err := s.Manifest(id)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(s.BlobPath(id))
	if err != nil {
		return nil, fmt.Errorf("open artifact %s: %w", id, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("open artifact %s: %w", id, err)
	}
	if uint64(st.Size()) != m.Size {
		return nil, fmt.Errorf("%w: artifact %s is %d bytes on disk, manifest says %d", ErrCorrupt, id, st.Size(), m.Size)
	}
	if m.Size == 0 {
		return &Blob{}, nil
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(m.Size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map artifact %s: %w", id, err)
	}
	return &Blob{data: data}, nil
}

// ReadAll returns a copy of an artifact's bytes (for small records).
func (s *Store) ReadAll(id cid.Cid) ([]byte, error) {
	if _, err := s.Manifest(id); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.BlobPath(id))
	if err != nil {
		return nil, fmt.Errorf("read artifact %s: %w", id, err)
	}
	return b, nil
}

// hugeBytes is the size of a PMD mapping (x86-64, arm64 with 4 KiB pages).
const hugeBytes = 2 << 20

// Verify rehashes every chunk of a stored artifact against its manifest. It walks the
// mapping front to back and drops each verified chunk's pages from the resident set, so
// verifying a multi-GB artifact costs the process a chunk, not the artifact (the page
// cache keeps the data).
func (s *Store) Verify(id cid.Cid) error {
	m, err := s.Manifest(id)
	if err != nil {
		return err
	}
	blob, err := s.Open(id)
	if err != nil {
		return err
	}
	defer blob.Close()
	data := blob.Bytes()
	if uint64(len(data)) != m.Size {
		return fmt.Errorf("%w: %d bytes, manifest says %d", ErrCorrupt, len(data), m.Size)
	}
	page := os.Getpagesize()
	done := 0 // bytes already dropped; a multiple of the page size
	for i, c := range m.Chunks {
		b, e := m.ChunkRange(i)
		if err := VerifyChunk(c, data[b:e]); err != nil {
			return fmt.Errorf("chunk %d: %w", i, err)
		}
		if end := int(e) / page * page; end > done {
			// From the 2 MiB boundary below: MADV_DONTNEED of part of a huge (PMD) mapping
			// of the page cache releases none of it.
			_ = syscall.Madvise(data[done/hugeBytes*hugeBytes:end], syscall.MADV_DONTNEED)
			done = end
		}
	}
	return nil
}

// VerifyBytes checks data against every chunk CID of m.
func VerifyBytes(m *Manifest, data []byte) error {
	if uint64(len(data)) != m.Size {
		return fmt.Errorf("%w: %d bytes, manifest says %d", ErrCorrupt, len(data), m.Size)
	}
	for i, c := range m.Chunks {
		b, e := m.ChunkRange(i)
		if err := VerifyChunk(c, data[b:e]); err != nil {
			return fmt.Errorf("chunk %d: %w", i, err)
		}
	}
	return nil
}

// Remove deletes an artifact (manifest first, so a crash never leaves a manifest without
// its blob).
func (s *Store) Remove(id cid.Cid) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Remove(s.manifestPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove artifact %s: %w", id, err)
	}
	if err := os.Remove(s.BlobPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove artifact %s: %w", id, err)
	}
	return nil
}

// TrackCommits starts recording the ids committed to the store, for TakeCommitted and
// RemoveIdle: a pruner's view of what is new.
func (s *Store) TrackCommits() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.committed == nil {
		s.committed = map[cid.Cid]struct{}{}
	}
}

// TakeCommitted returns the ids committed since the last call (or since TrackCommits),
// including commits of bytes the store already held: a writer that re-creates an
// artifact owns it again.
func (s *Store) TakeCommitted() []cid.Cid {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]cid.Cid, 0, len(s.committed))
	for id := range s.committed {
		out = append(out, id)
	}
	if s.committed != nil {
		clear(s.committed)
	}
	return out
}

// RemoveIdle deletes an artifact unless it was committed since the last TakeCommitted,
// and says whether it did: a pruner that decided from an older view never deletes what a
// writer has just (re)created. Like Remove, the manifest goes first.
func (s *Store) RemoveIdle(id cid.Cid) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, busy := s.committed[id]; busy {
		return false, nil
	}
	if err := os.Remove(s.manifestPath(id)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("remove artifact %s: %w", id, err)
	}
	if err := os.Remove(s.BlobPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return true, fmt.Errorf("remove artifact %s: %w", id, err)
	}
	return true, nil
}

// RemoveOrphans deletes blob files that have no manifest: what a crash between the two
// removals of Remove, or between a blob's rename and its manifest's write, left behind.
// Commits and removals hold the store's lock across both steps, so under it a blob
// without a manifest belongs to nobody. It returns how many bytes it freed.
func (s *Store) RemoveOrphans() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ents, err := os.ReadDir(filepath.Join(s.dir, "blobs"))
	if err != nil {
		return 0, fmt.Errorf("list artifact blobs: %w", err)
	}
	var freed int64
	for _, e := range ents {
		id, err := cid.Decode(e.Name())
		if err != nil {
			continue
		}
		if _, err := os.Stat(s.manifestPath(id)); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if fi, err := e.Info(); err == nil {
			freed += fi.Size()
		}
		if err := os.Remove(s.BlobPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return freed, fmt.Errorf("remove orphan blob %s: %w", id, err)
		}
	}
	return freed, nil
}

// List returns the ids of all complete artifacts.
func (s *Store) List() ([]cid.Cid, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "manifests"))
	if err != nil {
		return nil, fmt.Errorf("list artifacts: %w", err)
	}
	ids := make([]cid.Cid, 0, len(ents))
	for _, e := range ents {
		if c, err := cid.Decode(e.Name()); err == nil {
			ids = append(ids, c)
		}
	}
	return ids, nil
}
