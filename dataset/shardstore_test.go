package dataset

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
)

// peerFetcher stands in for the artifact protocol: it copies from another store.
type peerFetcher struct {
	from  *artifact.Store
	to    *artifact.Store
	calls int
	err   error
}

func (f *peerFetcher) Fetch(_ context.Context, id cid.Cid) error {
	f.calls++
	if f.err != nil {
		return f.err
	}
	b, err := f.from.ReadAll(id)
	if err != nil {
		return err
	}
	return f.to.PutVerified(bytes.NewReader(b), id)
}

var treeFiles = map[string]int{"a": 3000, "b": 2000, "c/d": 5000, "e": 100}

func newFixture(t *testing.T) (dir string, m *Manifest, plan *Plan) {
	t.Helper()
	dir = writeTree(t, treeFiles)
	m = mustBuild(t, dir)
	plan, err := NewPlan(m, 4000)
	if err != nil {
		t.Fatal(err)
	}
	return dir, m, plan
}

func checkPaths(t *testing.T, m *Manifest, ms Microshard, paths []string) {
	t.Helper()
	if len(paths) != len(ms.Files) {
		t.Fatalf("%d paths for %d files", len(paths), len(ms.Files))
	}
	for k, i := range ms.Files {
		got, err := os.ReadFile(paths[k])
		if err != nil {
			t.Fatal(err)
		}
		p := m.Files[i].Path
		if !bytes.Equal(got, fileBytes(p, treeFiles[p])) {
			t.Fatalf("%s: served bytes differ from the dataset file", p)
		}
	}
}

func TestPathsSources(t *testing.T) {
	tests := []struct {
		name       string
		root       bool // dataset directory available
		fetcher    bool
		fetchErr   error
		wantErr    error
		wantCalled bool
	}{
		{"imported from the dataset directory", true, true, nil, nil, false},
		{"fetched from peers", false, true, nil, nil, true},
		{"fetch fails", false, true, errors.New("no peers"), ErrUnavailable, true},
		{"nowhere to get it", false, false, nil, ErrUnavailable, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, m, plan := newFixture(t)
			peer := openStore(t)
			for _, f := range m.Files {
				if _, err := peer.PutFile(filepath.Join(dir, filepath.FromSlash(f.Path))); err != nil {
					t.Fatal(err)
				}
			}
			local := openStore(t)
			root := ""
			if tt.root {
				root = dir
			}
			var fetch Fetcher
			pf := &peerFetcher{from: peer, to: local, err: tt.fetchErr}
			if tt.fetcher {
				fetch = pf
			}
			ss, err := NewShardStore(local, root, m, fetch)
			if err != nil {
				t.Fatal(err)
			}
			ms := plan.Shards[0]
			paths, err := ss.Paths(context.Background(), ms)
			if (pf.calls > 0) != tt.wantCalled {
				t.Fatalf("fetcher called %d times, want called=%v", pf.calls, tt.wantCalled)
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), m.Files[ms.Files[0]].CID) {
					t.Fatalf("error does not name the CID: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkPaths(t, m, ms, paths)
		})
	}
}

// Once a file is in the store it is served from there, even if the dataset directory
// is later damaged or gone.
func TestPathsPrefersStore(t *testing.T) {
	dir, m, plan := newFixture(t)
	local := openStore(t)
	ss, err := NewShardStore(local, dir, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ss.Ensure(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	for _, ms := range plan.Shards {
		paths, err := ss.Paths(context.Background(), ms)
		if err != nil {
			t.Fatal(err)
		}
		checkPaths(t, m, ms, paths)
	}
}

func TestCorruptFileRefused(t *testing.T) {
	tests := []struct {
		name    string
		corrupt func(path string) error
	}{
		{"flipped byte", func(p string) error {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b[len(b)/2] ^= 0x40
			return os.WriteFile(p, b, 0o644)
		}},
		{"truncated", func(p string) error { return os.Truncate(p, 10) }},
		{"extended", func(p string) error {
			f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.Write([]byte("x"))
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, m, plan := newFixture(t)
			ms := plan.Shards[0]
			bad := m.Files[ms.Files[0]]
			if err := tt.corrupt(filepath.Join(dir, bad.Path)); err != nil {
				t.Fatal(err)
			}
			local := openStore(t)
			// A fetcher that would succeed must not be used to paper over local damage.
			peer := &peerFetcher{from: openStore(t), to: local}
			ss, err := NewShardStore(local, dir, m, peer)
			if err != nil {
				t.Fatal(err)
			}
			_, err = ss.Paths(context.Background(), ms)
			if !errors.Is(err, artifact.ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
			msg := err.Error()
			for _, want := range []string{bad.Path, bad.CID} {
				if !strings.Contains(msg, want) {
					t.Errorf("error does not mention %q: %v", want, msg)
				}
			}
			if ids := distinctCIDs(msg); len(ids) != 3 { // microshard, actual, expected
				t.Errorf("error should name the expected and the actual CID, found %v: %v", ids, msg)
			}
			if ids, _ := local.List(); len(ids) != 0 {
				t.Fatalf("store holds %d artifacts after a refused import", len(ids))
			}
			for _, sub := range []string{"blobs", "manifests", "tmp"} {
				if ents, _ := os.ReadDir(filepath.Join(local.Dir(), sub)); len(ents) != 0 {
					t.Fatalf("%s/ holds %d files after a refused import", sub, len(ents))
				}
			}
		})
	}
}

func TestImportAllReportsEveryFailure(t *testing.T) {
	dir, m, _ := newFixture(t)
	for _, p := range []string{"a", "c/d"} {
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(p)), []byte("wrong"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	local := openStore(t)
	ss, err := NewShardStore(local, dir, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = ss.ImportAll(context.Background())
	for _, p := range []string{"/a:", "c/d"} {
		if err == nil || !strings.Contains(err.Error(), p) {
			t.Fatalf("ImportAll error %v does not name %q", err, p)
		}
	}
	ids, _ := local.List()
	if len(ids) != 2 {
		t.Fatalf("store holds %d artifacts, want the 2 good files", len(ids))
	}
}

func TestPathsRefusesForeignMicroshard(t *testing.T) {
	_, m, plan := newFixture(t)
	ss, err := NewShardStore(openStore(t), "", m, nil)
	if err != nil {
		t.Fatal(err)
	}
	good := plan.Shards[0]
	tests := []struct {
		name string
		ms   Microshard
	}{
		{"wrong id", Microshard{Index: 0, ID: plan.Shards[1].ID, Files: good.Files}},
		{"index out of range", Microshard{Index: 0, ID: good.ID, Files: []int{len(m.Files)}}},
		{"negative index", Microshard{Index: 0, ID: good.ID, Files: []int{-1}}},
		{"no files", Microshard{Index: 0, ID: good.ID}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ss.Paths(context.Background(), tt.ms); err == nil {
				t.Fatal("foreign microshard accepted")
			}
		})
	}
}

func TestPathsHonoursContext(t *testing.T) {
	dir, m, plan := newFixture(t)
	ss, err := NewShardStore(openStore(t), dir, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ss.Paths(ctx, plan.Shards[0]); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func distinctCIDs(msg string) map[string]bool {
	ids := map[string]bool{}
	for _, w := range strings.FieldsFunc(msg, func(r rune) bool { return r == ' ' || r == '(' || r == ')' || r == ':' }) {
		if _, err := cid.Decode(w); err == nil {
			ids[w] = true
		}
	}
	return ids
}

// A microshard whose bytes rotted in the store after it was stored is not served: it is
// imported again from the dataset directory or fetched again from peers, and when neither
// can provide it the error is a ShardError naming the microshard and the file's CID.
func TestPathsReplacesShardsDamagedInTheStore(t *testing.T) {
	tests := []struct {
		name      string
		root      bool
		fetcher   bool
		wantFetch bool
		wantErr   error
	}{
		{"imported again from the dataset directory", true, true, false, nil},
		{"fetched again from peers", false, true, true, nil},
		{"nowhere to get it again", false, false, false, ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, m, plan := newFixture(t)
			ms := plan.Shards[0]
			peer := openStore(t)
			local := openStore(t)
			for _, f := range m.Files {
				for _, s := range []*artifact.Store{peer, local} {
					if _, err := s.PutFile(filepath.Join(dir, filepath.FromSlash(f.Path))); err != nil {
						t.Fatal(err)
					}
				}
			}
			// The stored copy of the microshard's first file rots.
			bad := m.Files[ms.Files[0]]
			id, err := cid.Decode(bad.CID)
			if err != nil {
				t.Fatal(err)
			}
			blob := local.BlobPath(id)
			b, err := os.ReadFile(blob)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/3] ^= 0x01
			if err := os.Chmod(blob, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(blob, b, 0o644); err != nil {
				t.Fatal(err)
			}

			root := ""
			if tt.root {
				root = dir
			}
			pf := &peerFetcher{from: peer, to: local}
			var fetch Fetcher
			if tt.fetcher {
				fetch = pf
			}
			ss, err := NewShardStore(local, root, m, fetch)
			if err != nil {
				t.Fatal(err)
			}
			paths, err := ss.Paths(context.Background(), ms)
			if (pf.calls > 0) != tt.wantFetch {
				t.Fatalf("fetcher called %d times, want called=%v", pf.calls, tt.wantFetch)
			}
			if tt.wantErr != nil {
				var se *ShardError
				if !errors.As(err, &se) || se.Index != ms.Index || !se.ID.Equals(ms.ID) || !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want a ShardError for microshard %d wrapping %v", err, ms.Index, tt.wantErr)
				}
				if !strings.Contains(err.Error(), bad.CID) || !strings.Contains(err.Error(), ms.ID.String()) {
					t.Fatalf("error does not name the file's CID %s and the microshard's %s: %v", bad.CID, ms.ID, err)
				}
				if local.Has(id) {
					t.Fatal("the damaged copy is still in the store")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkPaths(t, m, ms, paths)
			if err := local.Verify(id); err != nil {
				t.Fatalf("store copy after Paths: %v", err)
			}
		})
	}
}
