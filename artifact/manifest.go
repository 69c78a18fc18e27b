package artifact

import (
	"fmt"

	"github.com/fxamacker/cbor/v2"
	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/detcbor"
)

// DefaultChunkSize is used when the store is opened without one.
const DefaultChunkSize = 1 << 20

// Bounds on manifests we accept from disk or peers.
const (
	MinChunkSize     = 1 << 10
	MaxChunkSize     = 16 << 20
	MaxManifestBytes = 8 << 20
)

// ErrCorrupt is returned when bytes do not match their CID: cids.ErrCorrupt, under the name
// the store's callers know it by.
var ErrCorrupt = cids.ErrCorrupt

// ManifestVersion is the manifest format we write and accept: 2 names chunks by
// blake3-256 (version 1 used sha2-256).
const ManifestVersion = 2

// Manifest describes an artifact: its length, chunk size and the CID of every chunk.
type Manifest struct {
	Version   uint64    `cbor:"1,keyasint"`
	Size      uint64    `cbor:"2,keyasint"`
	ChunkSize uint64    `cbor:"3,keyasint"`
	Chunks    []cid.Cid `cbor:"4,keyasint"`
}

type wireManifest struct {
	Version   uint64   `cbor:"1,keyasint"`
	Size      uint64   `cbor:"2,keyasint"`
	ChunkSize uint64   `cbor:"3,keyasint"`
	Chunks    [][]byte `cbor:"4,keyasint"`
}

// decMode lets unknown fields through, as it always has: an artifact id names exact bytes.
var decMode = func() cbor.DecMode {
	m, err := detcbor.DecMode(detcbor.Limits{MaxArrayElements: MaxManifestBytes / 32, MaxNestedLevels: 4, AllowUnknownFields: true})
	if err != nil {
		panic(err)
	}
	return m
}()

// NumChunks is the number of chunks for size bytes at chunkSize.
func NumChunks(size, chunkSize uint64) uint64 {
	// Not (size+chunkSize-1)/chunkSize: that wraps for sizes near 2^64, and a manifest
	// claiming ~16 EiB in zero chunks would then validate.
	n := size / chunkSize
	if size%chunkSize != 0 {
		n++
	}
	return n
}

// ChunkRange is the byte range [begin, end) of chunk i.
func (m *Manifest) ChunkRange(i int) (begin, end int64) {
	begin = int64(i) * int64(m.ChunkSize)
	end = min(begin+int64(m.ChunkSize), int64(m.Size))
	return begin, end
}

// Encode returns the canonical CBOR bytes.
func (m *Manifest) Encode() []byte {
	w := wireManifest{Version: m.Version, Size: m.Size, ChunkSize: m.ChunkSize, Chunks: make([][]byte, len(m.Chunks))}
	for i, c := range m.Chunks {
		w.Chunks[i] = c.Bytes()
	}
	b, err := detcbor.Marshal(w)
	if err != nil {
		panic(fmt.Sprintf("encode manifest: %v", err)) // plain struct: cannot fail
	}
	return b
}

// ID is the artifact id: the CID of the canonical manifest encoding.
func (m *Manifest) ID() cid.Cid { return cids.Record(m.Encode()) }

// Validate checks the manifest is internally consistent.
func (m *Manifest) Validate() error {
	if m.Version != ManifestVersion {
		return fmt.Errorf("manifest version %d unsupported (want %d)", m.Version, ManifestVersion)
	}
	if m.ChunkSize < MinChunkSize || m.ChunkSize > MaxChunkSize {
		return fmt.Errorf("manifest chunk size %d outside [%d, %d]", m.ChunkSize, MinChunkSize, MaxChunkSize)
	}
	if want := NumChunks(m.Size, m.ChunkSize); uint64(len(m.Chunks)) != want {
		return fmt.Errorf("manifest lists %d chunks, size %d at chunk size %d needs %d", len(m.Chunks), m.Size, m.ChunkSize, want)
	}
	for i, c := range m.Chunks {
		if err := CheckChunkCID(c); err != nil {
			return fmt.Errorf("manifest chunk %d: %w", i, err)
		}
	}
	return nil
}

// DecodeManifest decodes and validates manifest bytes; if want is defined the bytes must
// hash to it.
func DecodeManifest(b []byte, want cid.Cid) (*Manifest, error) {
	if len(b) > MaxManifestBytes {
		return nil, fmt.Errorf("manifest of %d bytes exceeds %d", len(b), MaxManifestBytes)
	}
	if want.Defined() {
		if got := cids.Record(b); !got.Equals(want) {
			return nil, fmt.Errorf("%w: manifest hashes to %s, expected %s", ErrCorrupt, got, want)
		}
	}
	var w wireManifest
	if err := decMode.Unmarshal(b, &w); err != nil {
		return nil, fmt.Errorf("decode manifest: %w", err)
	}
	m := &Manifest{Version: w.Version, Size: w.Size, ChunkSize: w.ChunkSize, Chunks: make([]cid.Cid, len(w.Chunks))}
	for i, raw := range w.Chunks {
		c, err := cid.Cast(raw)
		if err != nil {
			return nil, fmt.Errorf("decode manifest chunk %d: %w", i, err)
		}
		m.Chunks[i] = c
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}
