//go:build chaos

package e2e

// chaosKills: the nightly-style run (`go test -tags chaos -run TestChaos ./e2e/`).
const chaosKills = 16
