package node

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/lease"
)

// config bounds lease.microshards_per_trainer by the most one lease may grant; it keeps its
// own copy of the number (config imports none of the node's packages).
func TestConfigBoundsMicroshardsLikeTheLeasePackage(t *testing.T) {
	require.Equal(t, lease.MaxLeaseMicroshards, config.MaxMicroshardsPerTrainer)
}
