package artifact

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/internal/atomicfile"
)

// A download in progress lives in the store's partial/ directory:
//
//	partial/<id>.manifest  the manifest (checked against id whenever it is read)
//	partial/<id>.data      the artifact's bytes, each chunk written at its offset
//	partial/<id>.have      bitmap: bit i (byte i/8, least significant bit first) says
//	                       chunk i was written
//
// The bitmap is a hint, not a promise: it is written without fsync and may run ahead of
// the data after a crash, so every chunk it claims is hashed again when a download
// resumes. The data file is fsynced before it is renamed into blobs/.

// errChunkMissing is returned when a partial download does not hold a chunk (yet).
var errChunkMissing = errors.New("chunk not held")

// bitmapFlushBytes is how much newly written data may be unrecorded in the on-disk
// bitmap: at most this much is fetched again after a crash.
const bitmapFlushBytes = 16 << 20

// writebackBytes is how much data is written between kicks of the kernel's writeback,
// so that the final fsync finds little left to write.
const writebackBytes = 8 << 20

type partial struct {
	store    *Store
	id       cid.Cid
	m        *Manifest
	manifest []byte
	digests  [][DigestSize]byte
	data     *os.File
	haveFile *os.File
	// direct writes whole aligned chunks past the page cache: on a small machine the
	// kernel's copy into the page cache costs as much CPU as hashing the chunk, while
	// DMA from our buffer costs none. Nil when the file system refuses O_DIRECT; the
	// last chunk and unaligned chunk sizes always go through data.
	direct    *os.File
	directErr atomic.Bool // a direct write failed: use data from now on

	mu         sync.RWMutex // guards the fields below; readers of data hold RLock
	bits       []byte
	count      int
	dirty      int // chunks recorded in bits but not yet on disk
	flushEvery int
	closed     bool

	unsynced atomic.Int64 // bytes written since the last writeback kick
	wb       *writeback
}

func (s *Store) partialPath(id cid.Cid, ext string) string {
	return filepath.Join(s.dir, "partial", id.String()+ext)
}

// loadPartialManifest returns the manifest of an interrupted download of id, if there
// is one that still hashes to id.
func (s *Store) loadPartialManifest(id cid.Cid) ([]byte, *Manifest, bool) {
	b, err := os.ReadFile(s.partialPath(id, ".manifest"))
	if err != nil {
		return nil, nil, false
	}
	m, err := DecodeManifest(b, id)
	if err != nil {
		return nil, nil, false
	}
	return b, m, true
}

// chunkDigests extracts the digest of every chunk, so verifying a chunk is one hash and
// a compare, without building CIDs.
func chunkDigests(m *Manifest) ([][DigestSize]byte, error) {
	out := make([][DigestSize]byte, len(m.Chunks))
	for i, c := range m.Chunks {
		d, err := ChunkDigest(c)
		if err != nil {
			return nil, fmt.Errorf("manifest chunk %d: %w", i, err)
		}
		out[i] = d
	}
	return out, nil
}

// openPartial opens (or starts) the partial download of the artifact whose verified
// manifest is given. Chunks an earlier attempt recorded are hashed again; those that
// still match are kept, and their byte count is returned.
func (s *Store) openPartial(id cid.Cid, manifest []byte, m *Manifest) (p *partial, resumed int64, err error) {
	digests, err := chunkDigests(m)
	if err != nil {
		return nil, 0, err
	}
	mpath := s.partialPath(id, ".manifest")
	if old, err := os.ReadFile(mpath); err != nil || !bytes.Equal(old, manifest) {
		if err := atomicfile.Write(mpath, manifest, 0o644); err != nil {
			return nil, 0, fmt.Errorf("partial artifact %s: %w", id, err)
		}
	}
	data, err := os.OpenFile(s.partialPath(id, ".data"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, 0, fmt.Errorf("partial artifact %s: %w", id, err)
	}
	haveFile, err := os.OpenFile(s.partialPath(id, ".have"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		data.Close()
		return nil, 0, fmt.Errorf("partial artifact %s: %w", id, err)
	}
	p = &partial{
		store: s, id: id, m: m, manifest: manifest, digests: digests,
		data: data, haveFile: haveFile,
		bits:       make([]byte, (len(m.Chunks)+7)/8),
		flushEvery: max(1, bitmapFlushBytes/int(m.ChunkSize)),
	}
	defer func() {
		if err != nil {
			data.Close()
			haveFile.Close()
		}
	}()
	st, err := data.Stat()
	if err != nil {
		return nil, 0, fmt.Errorf("partial artifact %s: %w", id, err)
	}
	if uint64(st.Size()) != m.Size {
		if err := data.Truncate(int64(m.Size)); err != nil {
			return nil, 0, fmt.Errorf("partial artifact %s: %w", id, err)
		}
	}
	if resumed, err = p.recheck(); err != nil {
		return nil, 0, err
	}
	if m.ChunkSize%directIOAlign == 0 {
		p.direct = openDirect(data.Name())
	}
	p.wb = startWriteback(data)
	return p, resumed, nil
}

// recheck loads the on-disk bitmap and keeps only chunks whose bytes still hash right.
func (p *partial) recheck() (int64, error) {
	claimed := make([]byte, len(p.bits)+1)
	n, err := p.haveFile.ReadAt(claimed, 0)
	if err != nil && err != io.EOF {
		return 0, fmt.Errorf("partial artifact %s: read bitmap: %w", p.id, err)
	}
	if n != len(p.bits) { // absent, or from a different manifest: start over
		claimed = nil
	}
	var resumed int64
	if claimed != nil {
		buf := buffers.get(int(p.m.ChunkSize))
		defer buffers.put(buf)
		for i := range p.m.Chunks {
			if claimed[i/8]&(1<<(i%8)) == 0 {
				continue
			}
			begin, end := p.m.ChunkRange(i)
			b := (*buf)[:end-begin]
			if _, err := p.data.ReadAt(b, begin); err != nil {
				continue
			}
			if chunkSum(b) != p.digests[i] {
				continue
			}
			p.bits[i/8] |= 1 << (i % 8)
			p.count++
			resumed += end - begin
		}
	}
	if err := p.haveFile.Truncate(int64(len(p.bits))); err != nil {
		return 0, fmt.Errorf("partial artifact %s: %w", p.id, err)
	}
	if _, err := p.haveFile.WriteAt(p.bits, 0); err != nil {
		return 0, fmt.Errorf("partial artifact %s: write bitmap: %w", p.id, err)
	}
	return resumed, nil
}

// has reports whether chunk i is written.
func (p *partial) has(i int) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.bits[i/8]&(1<<(i%8)) != 0
}

// writeChunk stores verified chunk bytes at their offset and records them.
func (p *partial) writeChunk(i int, b []byte) error {
	begin, _ := p.m.ChunkRange(i)
	if err := p.writeAt(b, begin); err != nil {
		return fmt.Errorf("partial artifact %s: write chunk %d: %w", p.id, i, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bits[i/8]&(1<<(i%8)) != 0 {
		return nil
	}
	p.bits[i/8] |= 1 << (i % 8)
	p.count++
	p.dirty++
	if p.dirty >= p.flushEvery {
		return p.flushLocked()
	}
	return nil
}

func (p *partial) writeAt(b []byte, off int64) error {
	if p.direct != nil && !p.directErr.Load() && directIOAligned(b, off) {
		_, err := p.direct.WriteAt(b, off)
		if err == nil {
			return nil
		}
		// Some file systems accept O_DIRECT at open and refuse the write (EINVAL);
		// the buffered path below still works.
		p.directErr.Store(true)
	}
	if _, err := p.data.WriteAt(b, off); err != nil {
		return err
	}
	if p.unsynced.Add(int64(len(b))) >= writebackBytes {
		p.unsynced.Store(0)
		p.wb.kick()
	}
	return nil
}

func (p *partial) flushLocked() error {
	if p.dirty == 0 || p.closed {
		return nil
	}
	if _, err := p.haveFile.WriteAt(p.bits, 0); err != nil {
		return fmt.Errorf("partial artifact %s: write bitmap: %w", p.id, err)
	}
	p.dirty = 0
	return nil
}

// readChunk reads len(dst) bytes of chunk i starting at off within the artifact, for
// serving a chunk of an unfinished download to another peer.
func (p *partial) readChunk(i int, off int64, dst []byte) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed || p.bits[i/8]&(1<<(i%8)) == 0 {
		return errChunkMissing
	}
	_, err := p.data.ReadAt(dst, off)
	return err
}

// close keeps the partial state on disk for a later resume.
func (p *partial) close() error {
	p.wb.stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	err := p.flushLocked()
	p.closed = true
	p.data.Close()
	p.haveFile.Close()
	if p.direct != nil {
		p.direct.Close()
	}
	return err
}

// finish makes the complete data durable, installs it in the store and removes the
// partial state.
func (p *partial) finish() error {
	p.wb.stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.count != len(p.m.Chunks) {
		return fmt.Errorf("install artifact %s: %d of %d chunks present", p.id, p.count, len(p.m.Chunks))
	}
	p.closed = true
	p.haveFile.Close()
	if p.direct != nil {
		p.direct.Close()
	}
	path := p.data.Name()
	if err := p.data.Sync(); err != nil {
		p.data.Close()
		return fmt.Errorf("install artifact %s: sync: %w", p.id, err)
	}
	if err := p.data.Chmod(0o444); err != nil {
		p.data.Close()
		return fmt.Errorf("install artifact %s: %w", p.id, err)
	}
	if err := p.data.Close(); err != nil {
		return fmt.Errorf("install artifact %s: %w", p.id, err)
	}
	if err := p.store.install(p.id, path, p.manifest); err != nil {
		os.Chmod(path, 0o644) // writable again, so a later attempt can resume
		return err
	}
	// install leaves the file in place when another writer installed the artifact first.
	os.Remove(path)
	os.Remove(p.store.partialPath(p.id, ".have"))
	os.Remove(p.store.partialPath(p.id, ".manifest"))
	return nil
}

// partialExts are the files of one interrupted download.
var partialExts = []string{".manifest", ".data", ".have"}

// RemoveIdlePartials deletes the partial state of interrupted downloads that no Fetch is
// running or releasing and for which drop says yes (a pruner's age rule): without it, a
// download every caller gave up on (a contribution whose trainer vanished mid-upload)
// keeps its bytes on disk forever. A Fetch of such an id later starts from nothing. It
// returns the bytes freed.
func (x *Exchange) RemoveIdlePartials(drop func(cid.Cid) bool) (int64, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ents, err := os.ReadDir(filepath.Join(x.store.dir, "partial"))
	if err != nil {
		return 0, fmt.Errorf("list partial downloads: %w", err)
	}
	ids := map[cid.Cid]bool{}
	for _, e := range ents {
		name := e.Name()
		for _, ext := range partialExts {
			if base, ok := strings.CutSuffix(name, ext); ok {
				if id, err := cid.Decode(base); err == nil {
					ids[id] = true
				}
			}
		}
	}
	var freed int64
	for id := range ids {
		// join adds a download under x.mu before it touches the files, and it leaves
		// these maps only once it has closed them.
		if x.downloads[id] != nil || x.stopping[id] != nil || !drop(id) {
			continue
		}
		for _, ext := range partialExts {
			path := x.store.partialPath(id, ext)
			if fi, err := os.Stat(path); err == nil {
				freed += fi.Size()
			}
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return freed, fmt.Errorf("remove partial download %s: %w", id, err)
			}
		}
	}
	return freed, nil
}
