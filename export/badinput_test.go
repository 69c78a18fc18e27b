package export

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/pack"
)

// TestInPlaceRefusesAnotherModel: whatever is wrong with the model in the directory, an
// in-place sync fails with an error naming the file (and tensor) and writes nothing.
func TestInPlaceRefusesAnotherModel(t *testing.T) {
	const shard = 64 << 10
	src := memSource(t, smallLayout(), 1, 1)
	for _, tc := range []struct {
		name   string
		shard  int64                          // shard size of the sync
		damage func(t *testing.T, dir string) // applied to a fresh export of src
		want   []string                       // substrings of the error
		is     error
	}{
		{"different shape", shard, func(t *testing.T, dir string) {
			l := smallLayout()
			l[0].Shape = []int64{50, 2}
			exportOver(t, dir, memSource(t, l, 1, 1), shard)
		}, []string{ShardName(1, 3), `"decoder.bias"`}, ErrLayoutMismatch},
		{"renamed tensor", shard, func(t *testing.T, dir string) {
			l := smallLayout()
			l[4].Name = "temperature"
			exportOver(t, dir, memSource(t, l, 1, 1), shard)
		}, []string{IndexFile, `"scale"`}, ErrLayoutMismatch},
		{"other shard assignment", 150 << 10, nil, []string{IndexFile, "puts tensor"}, ErrLayoutMismatch},
		{"one file where shards are expected", shard, func(t *testing.T, dir string) {
			exportOver(t, dir, src, DefaultShardBytes)
		}, []string{SingleFile}, ErrLayoutMismatch},
		{"other experiment (header length)", shard, func(t *testing.T, dir string) {
			other := withRound(src, 1)
			other.Meta.Experiment = "a-much-longer-experiment-name"
			exportOver(t, dir, other, shard)
		}, []string{ShardName(1, 3), "header"}, ErrLayoutMismatch},
		{"foreign safetensors", shard, func(t *testing.T, dir string) {
			var b bytes.Buffer
			require.NoError(t, pack.Write(&b, []pack.Tensor{{Name: "decoder.bias", DType: pack.F16, Shape: []int64{200}, Data: make([]byte, 400)}}, nil))
			require.NoError(t, os.WriteFile(filepath.Join(dir, ShardName(1, 3)), b.Bytes(), 0o644))
		}, []string{ShardName(1, 3), `"decoder.weight"`}, ErrBadIndex},
		{"truncated shard", shard, func(t *testing.T, dir string) {
			path := filepath.Join(dir, ShardName(2, 3))
			st, err := os.Stat(path)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(path, st.Size()-100))
		}, []string{ShardName(2, 3), "outside data"}, pack.ErrMalformed},
		{"garbage file", shard, func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, ShardName(3, 3)), []byte("not a model at all"), 0o644))
		}, []string{ShardName(3, 3)}, pack.ErrMalformed},
		{"missing index entry", shard, func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(m map[string]string) { delete(m, "encoder.weight") })
		}, []string{IndexFile, `"encoder.weight"`}, ErrLayoutMismatch},
		{"index names a missing file", shard, func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, ShardName(3, 3))))
		}, []string{IndexFile, ShardName(3, 3)}, os.ErrNotExist},
		{"index escapes the directory", shard, func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(m map[string]string) { m["scale"] = "../model.safetensors" })
		}, []string{IndexFile, "../model.safetensors"}, ErrBadIndex},
		{"index is not JSON", shard, func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, IndexFile), []byte("{weight_map"), 0o644))
		}, []string{IndexFile}, ErrBadIndex},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := Export(ctx, src, dir, Options{ShardBytes: shard})
			require.NoError(t, err)
			if tc.damage != nil {
				tc.damage(t, dir)
			}
			before := dirHashes(t, dir)
			next := withRound(src, 2)
			next.Data[0] ^= 1
			_, err = Export(ctx, next, dir, Options{ShardBytes: tc.shard, InPlace: true})
			require.Error(t, err)
			require.ErrorIs(t, err, tc.is)
			for _, s := range tc.want {
				require.Contains(t, err.Error(), s)
			}
			require.Equal(t, before, dirHashes(t, dir), "nothing written")
		})
	}
}

// exportOver replaces the model in dir with src (a full export).
func exportOver(t *testing.T, dir string, src *Source, shard int64) {
	t.Helper()
	_, err := Export(ctx, src, dir, Options{ShardBytes: shard})
	require.NoError(t, err)
}

func rewriteIndex(t *testing.T, dir string, edit func(map[string]string)) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, IndexFile))
	require.NoError(t, err)
	idx, err := parseIndex(b)
	require.NoError(t, err)
	edit(idx.weightMap)
	out, err := encodeIndex(idx.weightMap, 0, "x")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, IndexFile), out, 0o644))
}

// TestFullDiskLeavesTheModelIntact fails the disk at many points of a sync: the error names
// a file, and the directory holds the old model with nothing left over.
func TestFullDiskLeavesTheModelIntact(t *testing.T) {
	src := memSource(t, smallLayout(), 1, 1)
	for _, tc := range []struct {
		name    string
		inPlace bool
		shard   int64
	}{
		{"full export", false, 64 << 10},
		{"in place", true, 64 << 10},
		{"in place, one file", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			exportOver(t, dir, src, tc.shard)
			before := dirHashes(t, dir)
			next := withRound(src, 2)
			for i := range next.Data {
				if i%20000 == 0 {
					next.Data[i] ^= 0x10
				}
			}
			// How much this sync writes when the disk has room (measured on a copy).
			probe := t.TempDir()
			exportOver(t, probe, src, tc.shard)
			rep, err := Export(ctx, next, probe, Options{ShardBytes: tc.shard, InPlace: tc.inPlace, BlockBytes: 4096})
			require.NoError(t, err)
			total := rep.Written
			// Bytes patched into model files after the commit. Totals can differ by a few
			// bytes between runs (the journal names random temp files), so one limit falls
			// well inside that phase rather than on its last byte.
			var patched int64
			for _, f := range rep.Files {
				if f.Mode == ModeBlocks {
					patched += f.Written
				}
			}
			var beforeCommit, afterCommit int
			for _, limit := range []int64{1, 100, total / 4, total / 2, rep.JournalBytes - 1, rep.JournalBytes + 1, total - patched/2, total - 1} {
				if limit <= 0 {
					continue
				}
				_, err := Export(ctx, next, dir, Options{ShardBytes: tc.shard, InPlace: tc.inPlace, BlockBytes: 4096, faults: &faults{diskBytes: limit}})
				if err == nil {
					// The limit fell after the commit's last byte: the sync completed.
					require.Equal(t, expectedHashes(t, next, norm(tc.shard)), dirHashes(t, dir))
					exportOver(t, dir, src, tc.shard)
					continue
				}
				require.ErrorIs(t, err, syscall.ENOSPC, "limit %d", limit)
				require.Contains(t, err.Error(), dir)
				got := dirHashes(t, dir)
				if _, pending := got[JournalFile]; pending {
					// Failed after the commit: the next recover completes the sync.
					afterCommit++
					_, err := Recover(dir, nil)
					require.NoError(t, err)
					require.Equal(t, expectedHashes(t, next, norm(tc.shard)), dirHashes(t, dir))
					exportOver(t, dir, src, tc.shard)
					continue
				}
				require.Equal(t, before, got, "limit %d: the old model, nothing left over", limit)
				beforeCommit++
			}
			t.Logf("failures before the commit: %d, after: %d", beforeCommit, afterCommit)
			require.Positive(t, beforeCommit)
			if tc.inPlace {
				require.Positive(t, afterCommit, "in place, blocks are written after the journal")
			}
		})
	}
}

// TestOutIsNotADirectory and friends: clear errors before anything is touched.
func TestBadDirectories(t *testing.T) {
	src := memSource(t, smallLayout(), 1, 1)
	file := filepath.Join(t.TempDir(), "model")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))
	_, err := Export(ctx, src, file, Options{})
	require.ErrorIs(t, err, ErrNotDir)
	require.Contains(t, err.Error(), file)

	empty := t.TempDir()
	_, err = VerifyDir(empty, src, nil)
	require.ErrorIs(t, err, ErrNoModel)
	require.Contains(t, err.Error(), empty)

	// A directory with other files but no model: in place writes the model beside them.
	other := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(other, "notes.txt"), []byte("hi"), 0o644))
	rep, err := Export(ctx, src, other, Options{InPlace: true})
	require.NoError(t, err)
	require.False(t, rep.InPlace)
	require.FileExists(t, filepath.Join(other, "notes.txt"))
}

func TestBusyDirectory(t *testing.T) {
	dir := t.TempDir()
	unlock, err := lockDir(dir)
	require.NoError(t, err)
	_, err = Export(ctx, memSource(t, smallLayout(), 1, 1), dir, Options{})
	require.ErrorIs(t, err, ErrBusy)
	unlock()
	_, err = Export(ctx, memSource(t, smallLayout(), 1, 1), dir, Options{})
	require.NoError(t, err)
}

// mountTmpfs mounts a small tmpfs (root only); the test is skipped where that is not allowed.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v): the injected-fault tests cover this case", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// TestRealFullDisk syncs onto a tmpfs too small for a second copy of the model.
func TestRealFullDisk(t *testing.T) {
	mnt := mountTmpfs(t, "1m")
	l := smallLayout()
	l[3].Shape = []int64{128, 1024 + 512} // ~800 KiB: fits once, not twice
	src := memSource(t, l, 1, 1)
	_, err := Export(ctx, src, mnt, Options{})
	require.NoError(t, err)
	before := dirHashes(t, mnt)

	next := withRound(src, 2)
	for i := range next.Data {
		next.Data[i] ^= 0x01 // everything changes: a whole rewrite, which cannot fit
	}
	for _, inPlace := range []bool{false, true} {
		_, err = Export(ctx, next, mnt, Options{InPlace: inPlace})
		require.ErrorIs(t, err, syscall.ENOSPC)
		require.Contains(t, err.Error(), filepath.Join(mnt, SingleFile))
		require.Equal(t, before, dirHashes(t, mnt), "the old model, nothing left over")
	}
	// A small change still syncs in place: the journal fits.
	small := withRound(src, 3)
	small.Data[100] ^= 0x01
	rep, err := Export(ctx, small, mnt, Options{InPlace: true})
	require.NoError(t, err)
	require.Equal(t, ModeBlocks, rep.Files[0].Mode)
	require.Equal(t, expectedHashes(t, small, DefaultShardBytes), dirHashes(t, mnt))
}

// TestReadOnlyDirectory: root ignores permission bits, so a read-only tmpfs stands in.
func TestReadOnlyDirectory(t *testing.T) {
	mnt := mountTmpfs(t, "4m")
	src := memSource(t, smallLayout(), 1, 1)
	_, err := Export(ctx, src, mnt, Options{ShardBytes: 64 << 10})
	require.NoError(t, err)
	before := dirHashes(t, mnt)
	if err := syscall.Mount("", mnt, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Skipf("cannot remount read-only: %v", err)
	}
	next := withRound(src, 2)
	for _, inPlace := range []bool{false, true} {
		_, err = Export(ctx, next, mnt, Options{ShardBytes: 64 << 10, InPlace: inPlace})
		require.ErrorIs(t, err, syscall.EROFS)
		require.Contains(t, err.Error(), mnt)
	}
	require.Equal(t, before, dirHashes(t, mnt))
	// Verifying needs no writes.
	_, err = VerifyDir(mnt, src, nil)
	require.NoError(t, err)
}

// TestTruncatedParamsBlob: a head whose params blob in the store was cut short is not
// exported; the error names the head and the params artifact, and the model directory
// keeps the model it had.
func TestTruncatedParamsBlob(t *testing.T) {
	root := t.TempDir()
	s := newStores(t, filepath.Join(root, "node"), 0)
	l := smallLayout()
	h1 := s.putHead(t, l, values(l, 1), 0, cid.Undef)
	h2 := s.putHead(t, l, values(l, 2), 1, h1)
	dir := filepath.Join(root, "model")
	src, err := OpenHead(s.arts, s.heads, h1)
	require.NoError(t, err)
	_, err = Export(ctx, src, dir, Options{})
	require.NoError(t, err)
	require.NoError(t, src.Close())
	before := dirHashes(t, dir)

	_, h, err := s.heads.Get(h2)
	require.NoError(t, err)
	pid, err := h.ParamsID()
	require.NoError(t, err)
	path := s.arts.BlobPath(pid)
	require.NoError(t, os.Chmod(path, 0o644))
	require.NoError(t, os.Truncate(path, 1000))
	_, err = OpenHead(s.arts, s.heads, h2)
	require.ErrorIs(t, err, artifact.ErrCorrupt)
	require.ErrorContains(t, err, h2.String())
	require.ErrorContains(t, err, pid.String())
	require.Equal(t, before, dirHashes(t, dir))
}
