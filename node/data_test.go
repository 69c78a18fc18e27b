package node

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/internal/progress"
)

// Preparing a dataset is shown by the bytes the workload has written under the directory.
func TestWatchDirShowsTheBytesWritten(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"prepared", nil},
		{"the workload failed", errors.New("workload exited 1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "already"), make([]byte, 100), 0o644))
			rec := &progress.Recorder{}
			// A period longer than the test: only the last look counts.
			finish := watchDir(rec, "preparing the dataset", dir, time.Hour)
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "train"), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "train", "part-0"), make([]byte, 4096), 0o644))
			require.NoError(t, os.Symlink("part-0", filepath.Join(dir, "train", "link")))
			finish(tc.err)
			require.Equal(t, []progress.Recorded{{Name: "preparing the dataset", Start: 100, Done: 4196, Finished: true, Err: tc.err}}, rec.Tasks())
		})
	}
	require.NotPanics(t, func() { watchDir(nil, "x", t.TempDir(), time.Hour)(nil) })
}
