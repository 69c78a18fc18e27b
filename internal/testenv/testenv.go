// Package testenv decides what a test does when something it needs is missing from the
// machine (an interpreter with torch, a Docker engine): on a developer's machine it skips
// with the reason, under CI (CI=true, where `make test` installed everything first) it
// fails, so a broken setup can never turn into a run of silently skipped tests. A missing
// GPU is the exception (NoGPU): it is a kind of machine, not a broken setup, and skips
// everywhere.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// Missing skips t, or fails it under CI, saying what is missing.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and a test dependency is missing: %s", msg)
	}
	t.Skip(msg)
}
