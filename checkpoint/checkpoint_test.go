package checkpoint

import (
	"context"
	"errors"
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/ipfs/go-cid"
)

func TestLoadEmpty(t *testing.T) {
	e := newEnv(t)
	if _, err := e.c.Load(); !errors.Is(err, ErrNoState) {
		t.Fatalf("err = %v, want ErrNoState", err)
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		snap Snapshot
	}{
		{"empty before genesis", Snapshot{}},
		{"meta only", Snapshot{Round: 3, Head: "bafyhead", Meta: map[string]string{"k": "v", "": "empty key"}}},
		{"large blobs", Snapshot{Round: 7, Large: map[string][]byte{"m": blobData(1, "m", 3<<20), "empty": {}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			saved, err := e.c.Save(context.Background(), tt.snap)
			if err != nil {
				t.Fatal(err)
			}
			if saved.Seq != 1 {
				t.Fatalf("first save has seq %d", saved.Seq)
			}
			e.reopen(t)
			loaded := mustLoad(t, e.c)
			if !reflect.DeepEqual(saved, loaded) {
				t.Fatalf("loaded %+v\nsaved  %+v", loaded, saved)
			}
			for name, want := range tt.snap.Large {
				b, err := e.c.OpenBlob(loaded, name)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(b.Bytes(), want) {
					t.Fatalf("blob %q differs", name)
				}
				b.Close()
			}
		})
	}
}

func TestKeepReference(t *testing.T) {
	e := newEnv(t)
	st := e.save(t, 1)
	if _, ok := st.Refs["params"]; !ok {
		t.Fatal("kept artifact missing from Refs")
	}
	e.reopen(t)
	e.checkRound(t, mustLoad(t, e.c), 1)
	path, err := e.c.BlobPath(st, "params")
	if err != nil || path != e.shared.BlobPath(st.Refs["params"]) {
		t.Fatalf("BlobPath(params) = %q, %v", path, err)
	}
	if _, err := e.c.BlobPath(st, "nope"); err == nil {
		t.Fatal("BlobPath of an unknown name succeeded")
	}
}

func TestSeqIncreasesAndOldGenerationsPruned(t *testing.T) {
	e := newEnv(t)
	var kept []cid.Cid
	for r := uint64(1); r <= 6; r++ {
		st := e.save(t, r)
		if st.Seq != r {
			t.Fatalf("save %d has seq %d", r, st.Seq)
		}
		kept = append(kept, st.Refs["params"])
	}
	if got := e.stateFiles(t); !slices.Equal(got, []uint64{6, 5, 4}) {
		t.Fatalf("state files %v, want the last 3 generations", got)
	}
	// Our own store holds exactly the blobs of the kept generations.
	ids, err := e.c.own.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3*2 {
		t.Fatalf("own store holds %d blobs, want 6 (3 generations × 2)", len(ids))
	}
	// Kept references live in the shared store and are never deleted by us.
	for _, id := range kept {
		if !e.shared.Has(id) {
			t.Fatalf("shared artifact %s was deleted", id)
		}
	}
	// Sequence numbers continue across a restart.
	e.reopen(t)
	if st := e.save(t, 7); st.Seq != 7 {
		t.Fatalf("seq after restart %d, want 7", st.Seq)
	}
}

// damage helpers for the newest generation.
func truncateFile(t *testing.T, path string) {
	t.Helper()
	makeWritable(t, path)
	if err := os.Truncate(path, 5); err != nil {
		t.Fatal(err)
	}
}

func flipByte(t *testing.T, path string) {
	t.Helper()
	makeWritable(t, path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x80
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCorruptNewestStateFallsBack(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, e *env)
	}{
		{"truncated", func(t *testing.T, e *env) { truncateFile(t, e.c.statePath(3)) }},
		{"flipped byte", func(t *testing.T, e *env) { flipByte(t, e.c.statePath(3)) }},
		{"empty", func(t *testing.T, e *env) { os.WriteFile(e.c.statePath(3), nil, 0o600) }},
		{"garbage", func(t *testing.T, e *env) { os.WriteFile(e.c.statePath(3), []byte("not cbor at all"), 0o600) }},
		{"generation misnamed", func(t *testing.T, e *env) {
			// state-3 holding generation 2's bytes: a copy gone wrong.
			b, _ := os.ReadFile(e.c.statePath(2))
			os.WriteFile(e.c.statePath(3), b, 0o600)
		}},
		{"oversized", func(t *testing.T, e *env) {
			os.WriteFile(e.c.statePath(3), make([]byte, MaxStateBytes+1), 0o600)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			for r := uint64(1); r <= 3; r++ {
				e.save(t, 10*r)
			}
			tt.damage(t, e)
			e.reopen(t)
			st := mustLoad(t, e.c)
			if st.Seq != 2 {
				t.Fatalf("loaded seq %d, want fallback to 2", st.Seq)
			}
			e.checkRound(t, st, 20)
			// The next save does not reuse the damaged generation's number.
			if st := e.save(t, 40); st.Seq != 4 {
				t.Fatalf("next seq %d, want 4", st.Seq)
			}
		})
	}
}

func TestBadBlobSkipsGeneration(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, e *env, st *State)
	}{
		{"own blob deleted", func(t *testing.T, e *env, st *State) {
			os.Remove(e.c.own.BlobPath(st.Blobs["momentum"]))
		}},
		{"own blob corrupted", func(t *testing.T, e *env, st *State) {
			flipByte(t, e.c.own.BlobPath(st.Blobs["momentum"]))
		}},
		{"own blob truncated", func(t *testing.T, e *env, st *State) {
			truncateFile(t, e.c.own.BlobPath(st.Blobs["residual"]))
		}},
		{"own blob manifest deleted", func(t *testing.T, e *env, st *State) {
			e.c.own.Remove(st.Blobs["residual"])
		}},
		{"kept artifact deleted from shared store", func(t *testing.T, e *env, st *State) {
			e.shared.Remove(st.Refs["params"])
		}},
		{"kept artifact corrupted", func(t *testing.T, e *env, st *State) {
			flipByte(t, e.shared.BlobPath(st.Refs["params"]))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.save(t, 1)
			newest := e.save(t, 2)
			tt.damage(t, e, newest)
			e.reopen(t)
			st := mustLoad(t, e.c)
			if st.Seq != 1 {
				t.Fatalf("loaded seq %d, want 1 (generation 2 is damaged)", st.Seq)
			}
			e.checkRound(t, st, 1)
		})
	}
}

// A corrupt blob is removed by Load, so saving the same bytes again repairs it instead
// of referencing the damaged file forever.
func TestSaveRepairsBlobLoadFoundCorrupt(t *testing.T) {
	e := newEnv(t)
	e.save(t, 1)
	st := e.save(t, 2)
	flipByte(t, e.c.own.BlobPath(st.Blobs["momentum"]))
	e.reopen(t)
	if got := mustLoad(t, e.c); got.Seq != 1 {
		t.Fatalf("loaded seq %d, want 1", got.Seq)
	}
	e.save(t, 2)
	e.reopen(t)
	e.checkRound(t, mustLoad(t, e.c), 2)
}

func TestAllGenerationsBad(t *testing.T) {
	e := newEnv(t)
	st := e.save(t, 1)
	e.shared.Remove(st.Refs["params"])
	e.reopen(t)
	if _, err := e.c.Load(); !errors.Is(err, ErrNoState) {
		t.Fatalf("err = %v, want ErrNoState", err)
	}
}

func TestSaveRefusesBadSnapshot(t *testing.T) {
	e := newEnv(t)
	good := e.snap(t, 1)
	tests := []struct {
		name string
		edit func(s *Snapshot)
	}{
		{"name in Large and Keep", func(s *Snapshot) { s.Large["params"] = []byte("x") }},
		{"kept artifact missing", func(s *Snapshot) { s.Keep["params"] = headCID(t) }},
		{"kept id is not an artifact", func(s *Snapshot) { s.Keep["x"] = cid.Undef }},
		{"empty blob name", func(s *Snapshot) { s.Large[""] = []byte("x") }},
		{"invalid UTF-8 meta", func(s *Snapshot) { s.Meta["k"] = "\xff" }},
		{"invalid UTF-8 head", func(s *Snapshot) { s.Head = "\xfe" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := good
			s.Large = map[string][]byte{"momentum": good.Large["momentum"]}
			s.Keep = map[string]cid.Cid{"params": good.Keep["params"]}
			s.Meta = map[string]string{}
			tt.edit(&s)
			if _, err := e.c.Save(context.Background(), s); err == nil {
				t.Fatal("bad snapshot saved")
			}
			if _, err := e.c.Load(); !errors.Is(err, ErrNoState) {
				t.Fatalf("a refused snapshot left a generation behind: %v", err)
			}
		})
	}
}

// headCID is a valid artifact id that no store holds.
func headCID(t *testing.T) cid.Cid {
	t.Helper()
	c, err := cid.V1Builder{Codec: 0x51, MhType: 0x12}.Sum([]byte("absent"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestKeepWithoutSharedStore(t *testing.T) {
	c, err := Open(t.TempDir(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Save(context.Background(), Snapshot{Keep: map[string]cid.Cid{"p": headCID(t)}})
	if err == nil {
		t.Fatal("Keep accepted without a shared store")
	}
}

func TestOpenLocksDirectory(t *testing.T) {
	e := newEnv(t)
	if _, err := Open(e.dir, e.shared, nil); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: err = %v, want ErrLocked", err)
	}
	e.c.Close()
	c, err := Open(e.dir, e.shared, nil)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	c.Close()
}

func TestOpenRemovesPartialStateFiles(t *testing.T) {
	e := newEnv(t)
	e.save(t, 1)
	partial := e.dir + "/.state-00000000000000000002.cbor.tmp123"
	if err := os.WriteFile(partial, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.reopen(t)
	if _, err := os.Stat(partial); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("partial file survived Open: %v", err)
	}
	if st := mustLoad(t, e.c); st.Seq != 1 {
		t.Fatalf("loaded seq %d", st.Seq)
	}
}

func TestCloseFlushesAndRefusesMore(t *testing.T) {
	e := newEnv(t)
	e.c.SaveAsync(e.snap(t, 5))
	if err := e.c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := e.c.Save(context.Background(), e.snap(t, 6)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Save after Close: err = %v, want ErrClosed", err)
	}
	e.c.SaveAsync(e.snap(t, 7)) // dropped, must not block or panic
	if _, err := e.c.Load(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Load after Close: err = %v, want ErrClosed", err)
	}
	e.c = nil
	e.reopen(t)
	e.checkRound(t, mustLoad(t, e.c), 5)
}

// KeepGenerations bounds the generations kept; AfterPrune sees exactly those, newest
// first, after each save, and is not called while a kept generation is unreadable (what it
// references is then unknown, so nothing may be pruned for it).
func TestKeepGenerationsAndAfterPrune(t *testing.T) {
	e := newEnv(t)
	e.c.Close()
	var seen [][]uint64
	c, err := Open(e.dir, e.shared, nil, KeepGenerations(2), AfterPrune(func(kept []*State) {
		var seqs []uint64
		for _, st := range kept {
			if st.Refs["params"] == cid.Undef {
				t.Errorf("generation %d: refs not decoded", st.Seq)
			}
			seqs = append(seqs, st.Seq)
		}
		seen = append(seen, seqs)
	}))
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	t.Cleanup(func() { c.Close() })
	for r := uint64(1); r <= 4; r++ {
		e.save(t, r)
	}
	if got := e.stateFiles(t); !slices.Equal(got, []uint64{4, 3}) {
		t.Fatalf("state files %v, want the last 2 generations", got)
	}
	want := [][]uint64{{1}, {2, 1}, {3, 2}, {4, 3}}
	if !slices.EqualFunc(seen, want, slices.Equal) {
		t.Fatalf("AfterPrune saw %v, want %v", seen, want)
	}
	// Damage what will be the older kept generation: the next save prunes nothing and
	// calls nothing.
	truncateFile(t, e.c.statePath(4))
	e.save(t, 5)
	if len(seen) != len(want) {
		t.Fatalf("AfterPrune called with an unreadable kept generation: %v", seen[len(want):])
	}
	e.save(t, 6)
	if got := seen[len(seen)-1]; !slices.Equal(got, []uint64{6, 5}) {
		t.Fatalf("AfterPrune saw %v once the damaged generation aged out, want [6 5]", got)
	}
}
