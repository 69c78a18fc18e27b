package node

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
)

// `p2pnode audit`, `export` and `verify` open the stores while the node may be running on
// them: a head or an artifact the node is writing at that moment must survive.
func TestOpenStoresLeavesTheRunningNodesWritesAlone(t *testing.T) {
	cfg := config.Default()
	cfg.Node.StoreDir = t.TempDir()
	_, err := OpenStores(cfg)
	require.NoError(t, err)
	inFlight := []string{
		"artifacts/tmp/new-123",
		"artifacts/partial/.bafy.manifest.tmp89",
		"artifacts/manifests/.bafy.tmp4567",
		"heads/.bafy.tmp42",
	}
	for _, f := range inFlight {
		require.NoError(t, os.WriteFile(filepath.Join(cfg.Node.StoreDir, f), []byte("x"), 0o644))
	}
	_, err = OpenStores(cfg)
	require.NoError(t, err)
	for _, f := range inFlight {
		require.FileExists(t, filepath.Join(cfg.Node.StoreDir, f))
	}
}
