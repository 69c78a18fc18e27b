// Package version owns the build's version string, set at link time by the Makefile
// (-ldflags "-X github.com/p2pnode/p2pnode/internal/version.Version=..."), and the VCS
// revision Go records in the binary.
package version

import (
	"runtime/debug"
	"sync"
)

// Version is the release, or "dev" for a plain `go build` / `go run`.
var Version = "dev"

// Revision is the VCS commit the binary was built from (with "+dirty" when the tree had
// uncommitted changes), or "unknown" when Go recorded none (go run, tests, -buildvcs=false).
var Revision = sync.OnceValue(func() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev == "" {
		return "unknown"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	return rev + dirty
})
