package config

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestApplyEnvOverridesAnyKey(t *testing.T) {
	cfg := Default()
	set, err := cfg.ApplyEnv([]string{
		"P2PNODE_NODE_LISTEN=[/ip4/0.0.0.0/tcp/4001, /ip4/0.0.0.0/udp/4001/quic-v1]",
		"P2PNODE_WORKLOAD_DEVICE=cuda",
		"P2PNODE_LEASE_ROUND_TIMEOUT=30s",
		"P2PNODE_MERGE_SCREEN_MIN_COSINE=0.1",
		"P2PNODE_WORKLOAD_CONFIG={preset: small}",
		"P2PNODE_EXPERIMENT_ROLES=[trainer]",
		"P2PNODE_IMAGE=p2pnode:latest", // not a config key: other tools share the prefix
		"PATH=/usr/bin",
	})
	require.NoError(t, err)
	require.Equal(t, []string{"experiment.roles", "lease.round_timeout", "merge.screen.min_cosine", "node.listen", "workload.config", "workload.device"}, set)
	require.Equal(t, []string{"/ip4/0.0.0.0/tcp/4001", "/ip4/0.0.0.0/udp/4001/quic-v1"}, cfg.Node.Listen)
	require.Equal(t, "cuda", cfg.Workload.Device)
	require.Equal(t, 30*time.Second, cfg.Lease.RoundTimeout)
	require.Equal(t, 0.1, *cfg.Merge.Screen.MinCosine)
	require.Equal(t, map[string]any{"preset": "small"}, cfg.Workload.Config)
	require.Equal(t, []string{RoleTrainer}, cfg.Experiment.Roles)
	// Untouched keys keep their values.
	require.Equal(t, Default().Node.StoreDir, cfg.Node.StoreDir)
}

func TestApplyEnvBadValueNamesKeyAndVariable(t *testing.T) {
	for _, tc := range []struct{ env, want string }{
		{"P2PNODE_LEASE_ROUND_TIMEOUT=soon", "lease.round_timeout (from P2PNODE_LEASE_ROUND_TIMEOUT)"},
		{"P2PNODE_NODE_DHT=maybe", "node.dht (from P2PNODE_NODE_DHT)"},
		{"P2PNODE_WORKLOAD_CONFIG=[1, 2]", "workload.config (from P2PNODE_WORKLOAD_CONFIG)"},
		{"P2PNODE_NODE_LISTN=[/ip4/0.0.0.0/tcp/1]", "P2PNODE_NODE_LISTN: names no config key; did you mean P2PNODE_NODE_LISTEN?"},
		{"P2PNODE_PROTOCOL_DILOCO={outer_lr: 1}", "P2PNODE_PROTOCOL_DILOCO: names no config key"},
	} {
		cfg := Default()
		_, err := cfg.ApplyEnv([]string{tc.env})
		require.ErrorIs(t, err, ErrInvalid, tc.env)
		require.ErrorContains(t, err, tc.want, tc.env)
	}
}

func TestLoadAppliesEnvBeforeValidating(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p2pnode.yaml")
	require.NoError(t, os.WriteFile(path, []byte("{}"), 0o644))
	t.Setenv("P2PNODE_NODE_STORE_DIR", "state")
	t.Setenv("P2PNODE_WORKLOAD_INTERPRETER", "venv/bin/python")
	cfg, err := Load(path)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "state"), cfg.Node.StoreDir)
	require.Equal(t, filepath.Join(dir, "venv/bin/python"), cfg.Workload.Interpreter)

	t.Setenv("P2PNODE_EXPERIMENT_QUORUM", "5")
	_, err = Load(path)
	require.ErrorContains(t, err, "experiment.quorum")
}

// workload.interpreter: a bare name is looked up in PATH, a path is relative to the config.
func TestInterpreterResolvedLikeOtherPaths(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"python3", "python3"},
		{"/usr/bin/python3", "/usr/bin/python3"},
		{"venv/bin/python", "/exp/venv/bin/python"},
		{"./py", "/exp/py"},
	} {
		cfg := Default()
		cfg.Workload.Interpreter = tc.in
		cfg.Resolve("/exp")
		require.Equal(t, tc.want, cfg.Workload.Interpreter, tc.in)
	}
}
