package artifact

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/p2pnode/p2pnode/cids"
)

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// The Hasher must give the id the store gives, or dataset manifests would name artifacts
// nobody can fetch.
func TestHasherMatchesStore(t *testing.T) {
	const cs = MinChunkSize
	tests := []struct {
		name string
		size int
	}{
		{"empty", 0},
		{"one byte", 1},
		{"chunk minus one", cs - 1},
		{"one chunk", cs},
		{"chunk plus one", cs + 1},
		{"several chunks and a tail", 3*cs + 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := OpenStore(t.TempDir(), Options{ChunkSize: cs})
			if err != nil {
				t.Fatal(err)
			}
			data := randomBytes(uint64(tt.size), tt.size)
			want, err := s.PutBytes(data)
			if err != nil {
				t.Fatal(err)
			}

			m, err := ManifestOf(bytes.NewReader(data), cs)
			if err != nil {
				t.Fatal(err)
			}
			if got := m.ID(); !got.Equals(want) {
				t.Fatalf("ManifestOf id %s, store id %s", got, want)
			}
			if err := m.Validate(); err != nil {
				t.Fatal(err)
			}

			// Odd write sizes exercise the partial-chunk path.
			h, err := NewHasher(cs)
			if err != nil {
				t.Fatal(err)
			}
			for rest := data; len(rest) > 0; {
				n := min(len(rest), 1+len(rest)%333)
				h.Write(rest[:n])
				rest = rest[n:]
			}
			for i := range 2 { // twice: Manifest must not consume the tail
				if got := h.Manifest().ID(); !got.Equals(want) {
					t.Fatalf("call %d: Hasher id %s, store id %s", i, got, want)
				}
			}
		})
	}
}

func TestNewHasherChunkSize(t *testing.T) {
	for _, cs := range []int{-1, 1, MinChunkSize - 1, MaxChunkSize + 1} {
		if _, err := NewHasher(cs); err == nil {
			t.Errorf("chunk size %d accepted", cs)
		}
	}
	h, err := NewHasher(0)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Manifest().ChunkSize; got != DefaultChunkSize {
		t.Fatalf("chunk size 0 gave %d, want default %d", got, DefaultChunkSize)
	}
}

func TestPutVerified(t *testing.T) {
	const cs = MinChunkSize
	data := randomBytes(1, 2*cs+3)
	m, err := ManifestOf(bytes.NewReader(data), cs)
	if err != nil {
		t.Fatal(err)
	}
	id := m.ID()

	tests := []struct {
		name    string
		give    []byte
		wantErr error
	}{
		{"matching bytes are stored", data, nil},
		{"flipped byte is refused", append([]byte{data[0] ^ 1}, data[1:]...), ErrCorrupt},
		{"short input is refused", data[:len(data)-1], ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := OpenStore(t.TempDir(), Options{ChunkSize: cs})
			if err != nil {
				t.Fatal(err)
			}
			err = s.PutVerified(bytes.NewReader(tt.give), id)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				assertEmptyStore(t, s)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Verify(id); err != nil {
				t.Fatal(err)
			}
			got, err := s.ReadAll(id)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatal("stored bytes differ")
			}
			// A held artifact is not read again.
			if err := s.PutVerified(errReader{}, id); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func assertEmptyStore(t *testing.T, s *Store) {
	t.Helper()
	for _, sub := range []string{"manifests", "blobs", "tmp"} {
		ents, err := os.ReadDir(filepath.Join(s.Dir(), sub))
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 0 {
			t.Fatalf("%s/ holds %d entries after a refused put", sub, len(ents))
		}
	}
}

func TestPutVerifiedRejectsNonArtifactCID(t *testing.T) {
	s, err := OpenStore(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutVerified(bytes.NewReader(nil), cids.Raw(nil)); !errors.Is(err, cids.ErrBadCID) {
		t.Fatalf("err = %v, want cids.ErrBadCID", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("must not be read") }

func TestNumChunksNoOverflow(t *testing.T) {
	tests := []struct {
		size, cs, want uint64
	}{
		{0, 1024, 0},
		{1, 1024, 1},
		{1024, 1024, 1},
		{1025, 1024, 2},
		{^uint64(0), 1 << 20, ^uint64(0)/(1<<20) + 1},
	}
	for _, tt := range tests {
		if got := NumChunks(tt.size, tt.cs); got != tt.want {
			t.Errorf("NumChunks(%d, %d) = %d, want %d", tt.size, tt.cs, got, tt.want)
		}
	}
	m := &Manifest{Version: ManifestVersion, Size: ^uint64(0), ChunkSize: 1 << 20}
	if m.Validate() == nil {
		t.Fatal("a manifest claiming 2^64-1 bytes in no chunks validated")
	}
}
