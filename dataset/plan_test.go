package dataset

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/p2pnode/p2pnode/cids"
)

// sized builds a manifest of files with the given sizes and distinct contents.
func sized(sizes ...int64) *Manifest {
	m := &Manifest{Version: 1, Name: "t"}
	for i, n := range sizes {
		m.Files = append(m.Files, File{Path: fmt.Sprintf("f%03d", i), Bytes: n, Examples: int64(i), CID: fakeCID(fmt.Sprint(i))})
	}
	return m
}

func TestNewPlanGrouping(t *testing.T) {
	tests := []struct {
		name   string
		sizes  []int64
		target int64
		want   [][]int
	}{
		{"no files", nil, 10, nil},
		{"exact fits", []int64{5, 5, 5, 5}, 10, [][]int{{0, 1}, {2, 3}}},
		{"close on reaching, not exceeding", []int64{4, 4, 4, 4, 4}, 10, [][]int{{0, 1, 2}, {3, 4}}},
		{"big file alone", []int64{1, 30, 1}, 10, [][]int{{0, 1}, {2}}},
		{"every file its own", []int64{10, 11, 12}, 10, [][]int{{0}, {1}, {2}}},
		{"all in one", []int64{1, 2, 3}, 100, [][]int{{0, 1, 2}}},
		{"empty files ride along", []int64{0, 0, 10, 0}, 10, [][]int{{0, 1, 2}, {3}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPlan(sized(tt.sizes...), tt.target)
			if err != nil {
				t.Fatal(err)
			}
			var got [][]int
			for _, s := range p.Shards {
				got = append(got, s.Files)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("groups %v, want %v", got, tt.want)
			}
		})
	}
}

func TestNewPlanShardIDMatchesFormat(t *testing.T) {
	m := sized(5, 5, 5)
	p, err := NewPlan(m, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := cids.Raw([]byte(m.Files[0].CID + "\n" + m.Files[1].CID))
	if !p.Shards[0].ID.Equals(want) {
		t.Fatalf("shard id %s, want %s (newline-joined file cids)", p.Shards[0].ID, want)
	}
	mid, _ := m.ID()
	if p.ManifestID != mid.String() {
		t.Fatalf("manifest id %s, want %s", p.ManifestID, mid)
	}
	if got, ok := p.Shard(want); !ok || got.Index != 0 {
		t.Fatalf("Shard(%s) = %v, %v", want, got, ok)
	}
}

func TestNewPlanErrors(t *testing.T) {
	dup := sized(5, 5, 5, 5)
	dup.Files[2].CID = dup.Files[0].CID
	dup.Files[3].CID = dup.Files[1].CID
	tests := []struct {
		name    string
		m       *Manifest
		target  int64
		wantErr string
	}{
		{"zero target", sized(1), 0, "must be positive"},
		{"negative target", sized(1), -1, "must be positive"},
		{"invalid manifest", &Manifest{Version: 9, Name: "t"}, 1, "version"},
		{"identical microshards", dup, 10, "identical contents"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPlan(tt.m, tt.target)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
}

// The planner's invariants over random manifests: deterministic, every file in exactly one
// microshard and in order, sizes add up, and only the last microshard is under target.
func TestNewPlanProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		sizes := make([]int64, r.IntN(40))
		for i := range sizes {
			sizes[i] = r.Int64N(100)
		}
		target := 1 + r.Int64N(250)
		m := sized(sizes...)
		p, err := NewPlan(m, target)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		again, err := NewPlan(sized(sizes...), target)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(p, again) || !p.ID().Equals(again.ID()) {
			t.Fatalf("trial %d: planning twice differs", trial)
		}

		next := 0
		for k, s := range p.Shards {
			if s.Index != k {
				t.Fatalf("trial %d: shard %d has index %d", trial, k, s.Index)
			}
			var bytes, examples int64
			for _, i := range s.Files {
				if i != next {
					t.Fatalf("trial %d: shard %d holds file %d, want %d", trial, k, i, next)
				}
				next++
				bytes += sizes[i]
				examples += int64(i)
			}
			if bytes != s.Bytes || examples != s.Examples {
				t.Fatalf("trial %d: shard %d sums %d/%d, recorded %d/%d", trial, k, bytes, examples, s.Bytes, s.Examples)
			}
			last := k == len(p.Shards)-1
			if !last && s.Bytes < target {
				t.Fatalf("trial %d: shard %d closed at %d < target %d", trial, k, s.Bytes, target)
			}
			if s.Bytes-sizes[s.Files[len(s.Files)-1]] >= target {
				t.Fatalf("trial %d: shard %d reached target before its last file", trial, k)
			}
		}
		if next != len(sizes) {
			t.Fatalf("trial %d: %d of %d files planned", trial, next, len(sizes))
		}
	}
}

func TestPlanIDDependsOnInputs(t *testing.T) {
	m := sized(5, 5, 5, 5)
	base, _ := NewPlan(m, 10)
	otherTarget, _ := NewPlan(m, 5)
	m2 := sized(5, 5, 5, 5)
	m2.Name = "renamed"
	otherManifest, _ := NewPlan(m2, 10)
	if base.ID().Equals(otherTarget.ID()) || base.ID().Equals(otherManifest.ID()) {
		t.Fatal("plan id ignores the target or the manifest")
	}
}
