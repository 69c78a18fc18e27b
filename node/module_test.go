package node

import (
	"crypto/rand"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/export"
	"github.com/p2pnode/p2pnode/pyruntime"
	"github.com/p2pnode/p2pnode/status"
	"github.com/p2pnode/p2pnode/synth"
	"github.com/p2pnode/p2pnode/upkeep"
)

var roleMixes = [][]string{
	{config.RoleTrainer},
	{config.RoleValidator},
	{config.RoleBootstrap},
	{config.RoleValidator, config.RoleBootstrap},
	{config.RoleValidator, config.RoleTrainer},
	{config.RoleValidator, config.RoleTrainer, config.RoleBootstrap},
}

func TestModuleGraphIsValidForEveryRoleMix(t *testing.T) {
	for _, roles := range roleMixes {
		for _, feature := range []string{"defaults", "mdns+relay+psk", "no-dht-no-http"} {
			t.Run(feature+"/"+joinRoles(roles), func(t *testing.T) {
				cfg := soloConfig(t, t.TempDir(), 1)
				cfg.Experiment.Roles = roles
				if !cfg.Experiment.HasRole(config.RoleValidator) {
					// A trainer that validates nothing itself must name the validators.
					cfg.Experiment.Validators = []string{"12D3KooWJndsDidjsE4N4W9MaRtLQ8iPPLXypd7k2W1Pb4qTP46D"}
				}
				switch feature {
				case "mdns+relay+psk":
					cfg.Node.MDNS, cfg.Node.Relay = true, true
					cfg.Node.PSK = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
				case "no-dht-no-http":
					cfg.Node.DHT, cfg.Node.HTTP = false, "off"
				}
				require.NoError(t, cfg.Validate())
				require.NoError(t, fx.ValidateApp(Module(cfg, Options{})))
			})
		}
	}
}

// TestEveryRoleMixStartsAndStops builds each role mix on a real loopback host with the
// synthetic workload, starts it and stops it again, and checks the role loops it made.
func TestEveryRoleMixStartsAndStops(t *testing.T) {
	dir := t.TempDir()
	synthDataset(t, filepath.Join(dir, "data"), 4)
	for _, roles := range roleMixes {
		t.Run(joinRoles(roles), func(t *testing.T) {
			cfg := soloConfig(t, dir, 1)
			cfg.Node.StoreDir = t.TempDir()
			cfg.Experiment.Roles = roles
			var got []string
			app := fxtest.New(t, Module(cfg, Options{Runtime: synth.New(t.TempDir()), Logger: testLogger(t, "fx")}), fx.NopLogger,
				fx.Invoke(func(p loopParams) {
					for _, l := range p.Loops {
						got = append(got, l.name())
					}
				}))
			app.RequireStart().RequireStop()
			// One module per role: the validator's and the trainer's loops exactly when
			// experiment.roles names them (bootstrap has no loop of its own), beside the
			// loops every node runs.
			want := []string{"heads", "announce", "watch"}
			for _, r := range []string{config.RoleValidator, config.RoleTrainer} {
				if cfg.Experiment.HasRole(r) {
					want = append(want, r)
				}
			}
			require.ElementsMatch(t, want, got)
		})
	}
}

func joinRoles(roles []string) string {
	s := ""
	for i, r := range roles {
		if i > 0 {
			s += "+"
		}
		s += r
	}
	return s
}

// The hooks that run a loop in the background (roles, bus, kept peers, DHT rendezvous)
// stop promptly: each cancels its loop and waits for it, none waits out a loop's timer.
// The kept peer listens nowhere, so its redial loop is busy when the app stops.
func TestBackgroundLoopsStopPromptly(t *testing.T) {
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	absent, err := peer.IDFromPrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	synthDataset(t, filepath.Join(dir, "data"), 4)
	tests := []struct {
		name string
		dht  bool
		keep bool
	}{
		{"no discovery", false, false},
		{"dht", true, false},
		{"kept peer", false, true},
		{"dht and kept peer", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := soloConfig(t, dir, 1)
			cfg.Node.StoreDir = t.TempDir()
			cfg.Node.DHT = tt.dht
			if tt.keep {
				cfg.Node.Bootstrap = []string{"/ip4/127.0.0.1/tcp/1/p2p/" + absent.String()}
			}
			app := fxtest.New(t, Module(cfg, Options{Runtime: synth.New(t.TempDir()), Logger: testLogger(t, "fx")}), fx.NopLogger)
			app.RequireStart()
			time.Sleep(300 * time.Millisecond) // the loops are running
			start := time.Now()
			app.RequireStop()
			require.Less(t, time.Since(start), 5*time.Second, "stop waited for a loop's timer")
		})
	}
}

// A feature the config switches off is absent from the graph (nothing provides it), not
// provided as nil; switched on, it is there.
func TestSwitchedOffFeaturesAreAbsent(t *testing.T) {
	tests := []struct {
		name  string
		off   func(cfg *config.Config)
		needs fx.Option
	}{
		{"http", func(cfg *config.Config) { cfg.Node.HTTP = "off" }, fx.Invoke(func(*status.HTTPServer) {})},
		{"export", func(cfg *config.Config) { cfg.Export.EveryRounds = 0 }, fx.Invoke(func(*export.Writer) {})},
		{"pruning", func(cfg *config.Config) { cfg.Node.Archive = true }, fx.Invoke(func(*upkeep.Pruner) {})},
		{"workload", func(cfg *config.Config) { cfg.Experiment.Roles = []string{config.RoleBootstrap} }, fx.Invoke(func(pyruntime.Runtime) {})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := soloConfig(t, t.TempDir(), 1)
			cfg.Node.HTTP = "127.0.0.1:0"
			cfg.Export.EveryRounds, cfg.Export.Dir = 1, t.TempDir()
			require.NoError(t, cfg.Validate())
			require.NoError(t, fx.ValidateApp(Module(cfg, Options{}), tt.needs), "switched on")
			tt.off(cfg)
			require.NoError(t, cfg.Validate())
			require.NoError(t, fx.ValidateApp(Module(cfg, Options{})), "the graph without it")
			require.Error(t, fx.ValidateApp(Module(cfg, Options{}), tt.needs), "switched off, yet provided")
		})
	}
}

// The role modules declare what each role needs to fx: in the graph, the validator's and
// the trainer's loops hang off the parts they use (the keeper, the bus, the key; the
// trainer's window wrapper), not off the node's env.
func TestRoleModulesDeclareTheirDependencies(t *testing.T) {
	dir := t.TempDir()
	synthDataset(t, filepath.Join(dir, "data"), 4)
	cfg := soloConfig(t, dir, 1)
	cfg.Experiment.Roles = []string{config.RoleValidator, config.RoleTrainer}
	require.NoError(t, cfg.Validate())
	var dot fx.DotGraph
	app := fxtest.New(t, Module(cfg, Options{Runtime: synth.New(t.TempDir()), Logger: testLogger(t, "fx")}), fx.NopLogger, fx.Populate(&dot))
	app.RequireStart().RequireStop()

	// Each loop's constructor is a cluster of the DOT graph with an output in the loops
	// group; its edges name what it takes.
	loops := map[string]bool{}
	for _, m := range regexp.MustCompile(`subgraph (cluster_\d+) \{[^}]*"node\.loop\[group=loops\]`).FindAllStringSubmatch(string(dot), -1) {
		loops[m[1]] = true
	}
	deps := map[string][]string{}
	for _, m := range regexp.MustCompile(`constructor_(\d+) -> "([^"]+)"`).FindAllStringSubmatch(string(dot), -1) {
		if c := "cluster_" + m[1]; loops[c] {
			deps[c] = append(deps[c], m[2])
		}
	}
	require.Len(t, loops, 5, "heads, announce, watch, validator, trainer")
	var roles []string
	for c, d := range deps {
		if !slices.Contains(d, "*upkeep.Keeper") {
			require.Equal(t, []string{"*node.env"}, slices.DeleteFunc(d, func(s string) bool { return s == "fx.Shutdowner" }),
				"a loop every node runs takes the env")
			continue
		}
		require.NotContains(t, d, "*node.env", "a role declares its dependencies")
		require.Subset(t, d, []string{"*config.Config", "bus.Bus", "*chain.Tips", "*status.Board", "*status.Metrics", "node.validatorPeers"})
		switch {
		case slices.Contains(d, "crypto.PrivKey"):
			roles = append(roles, "validator")
			require.Subset(t, d, []string{"node.headFetcher", "*artifact.Store", "pyruntime.Runtime"}, c)
		case slices.Contains(d, "node.wrapWindows"):
			roles = append(roles, "trainer")
		}
	}
	require.ElementsMatch(t, []string{"validator", "trainer"}, roles)
}
