package node

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A trainer's store without room for a lease's packs says so, naming the directory; one
// with room, or one that cannot be asked, lets the lease go ahead.
func TestStoreRoom(t *testing.T) {
	dir := t.TempDir()
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(dir, &st))
	free := int64(st.Bavail) * int64(st.Bsize)
	for _, tc := range []struct {
		name   string
		dir    string
		params int64
		full   bool
	}{
		{"a small model", dir, 520, false},
		{"no parameter count", dir, 0, false},
		{"a model three copies of which do not fit", dir, free/12 + 1<<30, true},
		{"a directory that cannot be asked", filepath.Join(dir, "missing"), 1 << 60, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := storeRoom(tc.dir, tc.params)()
			if !tc.full {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.ErrorContains(t, err, "node.store_dir "+tc.dir+" has ")
			require.ErrorContains(t, err, "free space on its disk")
		})
	}
}
