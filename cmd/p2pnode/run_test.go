//go:build !attack

package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRunHasNoPoisonFlag: the default build's `p2pnode run` has no fault injection: no
// --poison in its help, and the flag is refused.
func TestRunHasNoPoisonFlag(t *testing.T) {
	out, err := run(t, "run", "--help")
	require.NoError(t, err)
	require.NotContains(t, out, "poison")
	_, err = run(t, "run", "--poison", "scale", "--help")
	require.ErrorContains(t, err, "unknown flag: --poison")
}
