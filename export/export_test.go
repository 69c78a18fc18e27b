package export

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/pack"
)

var ctx = context.Background()

func TestExportWritesAModelAnyReaderLoads(t *testing.T) {
	src := memSource(t, smallLayout(), 1, 7)
	for _, tc := range []struct {
		name       string
		shardBytes int64
		files      []string
	}{
		{"single file", 0, []string{SingleFile}},
		{"shards", 64 << 10, []string{ShardName(1, 3), ShardName(2, 3), ShardName(3, 3), IndexFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rep, err := Export(ctx, src, dir, Options{ShardBytes: tc.shardBytes})
			require.NoError(t, err)
			require.False(t, rep.InPlace)
			require.Equal(t, expectedHashes(t, src, norm(tc.shardBytes)), dirHashes(t, dir))
			require.ElementsMatch(t, tc.files, keys(dirHashes(t, dir)))

			// Every tensor is where the index says, with the pack's name, shape and bytes.
			where := map[string]string{}
			if len(tc.files) > 1 {
				b, err := os.ReadFile(filepath.Join(dir, IndexFile))
				require.NoError(t, err)
				var idx struct {
					Metadata  map[string]any    `json:"metadata"`
					WeightMap map[string]string `json:"weight_map"`
				}
				require.NoError(t, json.Unmarshal(b, &idx))
				require.EqualValues(t, len(src.Data), idx.Metadata["total_size"])
				where = idx.WeightMap
			}
			var off int64
			for _, e := range src.Layout {
				name := SingleFile
				if len(tc.files) > 1 {
					name = where[e.Name]
				}
				f, err := pack.Open(filepath.Join(dir, name))
				require.NoError(t, err)
				ti, ok := f.Header.Find(e.Name)
				require.True(t, ok, e.Name)
				require.Equal(t, pack.F32, ti.DType)
				require.True(t, slices.Equal(e.Shape, ti.Shape), "%v vs %v", e.Shape, ti.Shape)
				n := e.Elements() * 4
				require.Equal(t, src.Data[off:off+n], f.Bytes(ti))
				off += n
				md := f.Header.Metadata
				require.Equal(t, "pt", md["format"])
				require.Equal(t, FormatVersion, md["p2pnode_export"])
				require.Equal(t, "exp", md["experiment"])
				require.Equal(t, "net", md["network"])
				require.Equal(t, "7", md["round"])
				require.Equal(t, src.Meta.Head.String(), md["head"])
				require.Equal(t, src.Meta.Params.String(), md["params"])
				require.Equal(t, src.Layout.Hash(), md["layout_hash"])
				require.Zero(t, f.Header.DataStart%8, "data 8-aligned")
				require.NoError(t, f.Close())
			}
		})
	}
}

// norm is the shard size an export uses for opts.ShardBytes.
func norm(shardBytes int64) int64 {
	if shardBytes == 0 {
		return DefaultShardBytes
	}
	return shardBytes
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestHeaderLengthDoesNotDependOnTheHead(t *testing.T) {
	a := memSource(t, smallLayout(), 1, 0)
	for _, round := range []uint64{1, 99, 123456789, 1<<64 - 1} {
		b := withRound(a, round)
		b.Meta.Head, b.Meta.Params = fakeCID("h", round), fakeCID("p", round)
		pa, err := makePlan(a, 64<<10)
		require.NoError(t, err)
		pb, err := makePlan(b, 64<<10)
		require.NoError(t, err)
		for i := range pa.files {
			require.Len(t, pb.files[i].header, len(pa.files[i].header), "round %d", round)
		}
		require.Equal(t, pa.index, pb.index, "the index never changes with the head")
	}
}

func TestInPlaceSync(t *testing.T) {
	const block = 4096
	for _, tc := range []struct {
		name       string
		shardBytes int64
		fraction   float64 // of blocks changed
		wantMode   string
	}{
		{"one file, 5% changed", 0, 0.05, ModeBlocks},
		{"shards, 10% changed", 64 << 10, 0.10, ModeBlocks},
		{"most changed: whole rewrite", 0, 0.9, ModeRewrite},
		{"nothing changed but the round", 0, 0, ModeBlocks},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			old := memSource(t, smallLayout(), 1, 1)
			opts := Options{ShardBytes: tc.shardBytes, BlockBytes: block, InPlace: true}
			rep, err := Export(ctx, old, dir, opts)
			require.NoError(t, err)
			require.False(t, rep.InPlace, "no model yet: written whole")

			next := withRound(old, 2)
			p, err := makePlan(next, norm(tc.shardBytes))
			require.NoError(t, err)
			changeBlocks(next, int64(len(p.files[0].header)), block, tc.fraction, rand.New(rand.NewPCG(3, 3)))

			rep, err = Export(ctx, next, dir, opts)
			require.NoError(t, err)
			require.True(t, rep.InPlace)
			require.Equal(t, expectedHashes(t, next, norm(tc.shardBytes)), dirHashes(t, dir))
			var size int64
			for _, f := range p.files {
				size += f.size()
			}
			if tc.wantMode == ModeBlocks {
				require.Equal(t, size, rep.Compared)
			} else {
				require.Less(t, rep.Compared, size, "comparing stops once a rewrite is cheaper")
			}
			require.Positive(t, rep.Changed, "the header names the new round")
			require.Equal(t, tc.wantMode, rep.Files[0].Mode)
			if tc.wantMode == ModeBlocks {
				require.Positive(t, rep.JournalBytes)
				var patched int64
				for _, f := range rep.Files {
					if f.Mode == ModeBlocks {
						require.Equal(t, f.Changed, f.Written, f.Name)
						patched += f.Changed
					}
				}
				require.Greater(t, rep.JournalBytes, patched, "every patched block is journaled first")
			}

			// The same export again changes nothing and writes nothing.
			rep, err = Export(ctx, next, dir, opts)
			require.NoError(t, err)
			require.Zero(t, rep.Changed)
			require.Zero(t, rep.Written)
			require.Equal(t, ModeUnchanged, rep.Files[0].Mode)
		})
	}
}

func TestFullExportReplacesAnOldModelAtomically(t *testing.T) {
	dir := t.TempDir()
	src := memSource(t, smallLayout(), 1, 1)
	_, err := Export(ctx, src, dir, Options{ShardBytes: 64 << 10})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte("{}"), 0o644))

	// One file now: the shards and the index are stale and removed; other files stay.
	next := withRound(src, 2)
	rep, err := Export(ctx, next, dir, Options{})
	require.NoError(t, err)
	removed := 0
	for _, f := range rep.Files {
		if f.Mode == ModeRemoved {
			removed++
		}
	}
	require.Equal(t, 4, removed)
	require.Equal(t, expectedHashes(t, next, DefaultShardBytes), dirHashes(t, dir))
	require.FileExists(t, filepath.Join(dir, "config.json"))
}

func TestSameHeadSameBytes(t *testing.T) {
	src := memSource(t, smallLayout(), 5, 3)
	a, b := t.TempDir(), t.TempDir()
	_, err := Export(ctx, src, a, Options{ShardBytes: 64 << 10})
	require.NoError(t, err)
	// b first holds another version, then syncs in place: it must end byte-identical.
	_, err = Export(ctx, memSource(t, smallLayout(), 6, 2), b, Options{ShardBytes: 64 << 10})
	require.NoError(t, err)
	_, err = Export(ctx, src, b, Options{ShardBytes: 64 << 10, InPlace: true})
	require.NoError(t, err)
	require.Equal(t, dirHashes(t, a), dirHashes(t, b))
}

func TestRecoveryAfterACrashAtEachPoint(t *testing.T) {
	for _, tc := range []struct {
		point   string
		shard   int64
		inPlace bool
		want    Recovery
		newer   bool // the directory ends with the new model
	}{
		{crashBeforeCommit, 0, true, RecoveryDiscarded, false},
		{crashAfterCommit, 0, true, RecoveryReapplied, true},
		{crashMidApply, 64 << 10, true, RecoveryReapplied, true},
		{crashBeforeCommit, 64 << 10, false, RecoveryDiscarded, false},
		{crashAfterCommit, 64 << 10, false, RecoveryReapplied, true},
	} {
		for _, by := range []string{"recover", "export", "verify"} {
			t.Run(tc.point+"/inplace="+strconv.FormatBool(tc.inPlace)+"/"+by, func(t *testing.T) {
				dir := t.TempDir()
				old := memSource(t, smallLayout(), 1, 1)
				_, err := Export(ctx, old, dir, Options{ShardBytes: tc.shard})
				require.NoError(t, err)
				next := withRound(old, 2)
				changeBlocks(next, 0, 4096, 0.2, rand.New(rand.NewPCG(1, 2)))

				opts := Options{ShardBytes: tc.shard, BlockBytes: 4096, InPlace: tc.inPlace, faults: &faults{crashAt: tc.point}}
				_, err = Export(ctx, next, dir, opts)
				require.ErrorIs(t, err, errCrash)
				require.FileExists(t, filepath.Join(dir, JournalFile))

				want := old
				if tc.newer {
					want = next
				}
				switch by {
				case "recover":
					got, err := Recover(dir, nil)
					require.NoError(t, err)
					require.Equal(t, tc.want, got)
				case "export": // the next export of the same version recovers first
					opts.faults = nil
					rep, err := Export(ctx, want, dir, opts)
					require.NoError(t, err)
					require.Equal(t, tc.want, rep.Recovered)
				case "verify":
					dc, err := VerifyDir(dir, want, nil)
					require.NoError(t, err)
					require.Equal(t, tc.want, dc.Recovered)
				}
				require.Equal(t, expectedHashes(t, want, norm(tc.shard)), dirHashes(t, dir))
			})
		}
	}
}

func TestBadOptionsAndSources(t *testing.T) {
	src := memSource(t, smallLayout(), 1, 1)
	for _, tc := range []struct {
		name string
		src  *Source
		opts Options
		want string
	}{
		{"block too small", src, Options{BlockBytes: 100}, "block size 100"},
		{"block too large", src, Options{BlockBytes: MaxBlockBytes + 1}, "block size"},
		{"negative shard size", src, Options{ShardBytes: -1}, "shard size"},
		{"short data", &Source{Layout: src.Layout, Data: src.Data[:100]}, Options{}, "100 data bytes"},
		{"names out of order", &Source{Layout: pack.Layout{{Name: "b"}, {Name: "a"}}, Data: make([]byte, 8)}, Options{}, "ascending"},
		{"nil source", nil, Options{}, "nil source"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := Export(ctx, tc.src, dir, tc.opts)
			require.ErrorContains(t, err, tc.want)
			require.Empty(t, dirHashes(t, dir))
		})
	}

	// A head whose params artifact the store does not hold: named in the error.
	st := newStores(t, t.TempDir(), 0)
	id := st.putHead(t, smallLayout(), values(smallLayout(), 1), 0, cid.Undef)
	_, h, err := st.heads.Get(id)
	require.NoError(t, err)
	pid, err := h.ParamsID()
	require.NoError(t, err)
	require.NoError(t, st.arts.Remove(pid))
	_, err = OpenHead(st.arts, st.heads, id)
	require.ErrorIs(t, err, artifact.ErrNotFound)
	require.ErrorContains(t, err, id.String())
	require.ErrorContains(t, err, pid.String())
}
