//go:build attack

package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
)

// TestRunPoisonFlagInAttackBuild: the attack build's `p2pnode run` takes --poison MODE and
// refuses a mode it does not know, naming the flag.
func TestRunPoisonFlagInAttackBuild(t *testing.T) {
	out, err := run(t, "run", "--help")
	require.NoError(t, err)
	require.Contains(t, out, "--poison")
	cfg := writeConfig(t, t.TempDir(), func(*config.Config) {})
	_, err = run(t, "run", "--config", cfg, "--poison", "bogus")
	require.ErrorContains(t, err, `--poison: unknown attack mode "bogus"`)
}
