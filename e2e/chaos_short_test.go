//go:build !chaos

package e2e

// chaosKills is how many kill -9s TestChaosKillsAndDamagedState does: a short run for
// `make test` (the chaos build tag runs the long one).
const chaosKills = 4
