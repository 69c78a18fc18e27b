package node

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/synth"
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
// synthetic workload, starts it and stops it again.
func TestEveryRoleMixStartsAndStops(t *testing.T) {
	dir := t.TempDir()
	synthDataset(t, filepath.Join(dir, "data"), 4)
	for _, roles := range roleMixes {
		t.Run(joinRoles(roles), func(t *testing.T) {
			cfg := soloConfig(t, dir, 1)
			cfg.Node.StoreDir = t.TempDir()
			cfg.Experiment.Roles = roles
			app := fxtest.New(t, Module(cfg, Options{Runtime: synth.New(t.TempDir()), Logger: testLogger(t, "fx")}), fx.NopLogger)
			app.RequireStart().RequireStop()
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
