package invite

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
)

func TestRankAddrsWidestFirst(t *testing.T) {
	ifaces := map[string]string{"172.17.0.1": "docker0", "192.168.1.5": "eth0", "203.0.113.9": "eth1"}
	got := RankAddrs([]string{
		"/ip4/127.0.0.1/tcp/4001",
		"/ip4/172.17.0.1/tcp/4001",
		"/ip4/192.168.1.5/tcp/4001",
		"/ip4/0.0.0.0/tcp/4001",
		"/ip4/8.8.4.4/tcp/4001/p2p/12D3KooWGs7fzghcbnMn1A3hMgmCXiksCseBuSj7V7WEbmiH7YWU",
		"/ip4/8.8.4.4/tcp/4001",
		"/ip6/fe80::1/tcp/4001",
		"/dns4/example.org/tcp/4001",
	}, ifaces)
	require.Equal(t, []RankedAddr{
		{"/ip4/8.8.4.4/tcp/4001", ReachPublic},
		{"/ip4/192.168.1.5/tcp/4001", ReachPrivate},
		{"/ip4/172.17.0.1/tcp/4001", ReachLocal},
		{"/ip4/127.0.0.1/tcp/4001", ReachLoopback},
	}, got)
}

func TestLocalConfigLoadsWithTheLocalSettings(t *testing.T) {
	_, self := newKey(t)
	exp, err := Experiment(ownerConfig(), self.String())
	require.NoError(t, err)
	text, err := LocalConfig(exp, self.String(), Local{StoreDir: "store", Listen: []string{"/ip4/0.0.0.0/tcp/4002"}, HTTP: "127.0.0.1:0",
		Bootstrap: []string{"/ip4/198.18.0.1/tcp/4001/p2p/" + self.String()}, Roles: []string{config.RoleTrainer}, Device: "cpu", DatasetRoot: "data/lm"})
	require.NoError(t, err)
	cfg, err := config.Parse(text)
	require.NoError(t, err)
	cfg.Resolve("/v")
	require.NoError(t, cfg.Validate())
	require.Equal(t, "/v/store", cfg.Node.StoreDir)
	require.Equal(t, "/v/data/lm", cfg.Dataset.Root)
	require.Equal(t, "cpu", cfg.Workload.Device)
	require.Equal(t, []string{config.RoleTrainer}, cfg.Experiment.Roles)
	require.Equal(t, ownerConfig().Protocol, cfg.Protocol)
	require.Contains(t, string(text), ID(exp).String())
}

func TestDiffNamesChangedKeys(t *testing.T) {
	a := []byte("experiment:\n  id: x\n  rounds: 1\nprotocol:\n  codec: fp32\n")
	b := []byte("experiment:\n  id: x\n  rounds: 2\nprotocol:\n  codec: fp32\n  overlap: eager\n")
	require.Equal(t, []string{"experiment.rounds: 1 → 2", "protocol.overlap: (unset) → eager"}, Diff(a, b))
	require.Empty(t, Diff(a, a))
}
