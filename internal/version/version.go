// Package version owns the build's version string, set at link time by the Makefile
// (-ldflags "-X github.com/p2pnode/p2pnode/internal/version.Version=..."), and the VCS
// revision Go records in the binary.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
)

// String is the one-line version: "p2pnode 0.1.0 (revision 1a2b3c4d5e6f, go1.26.8)".
func String() string {
	return fmt.Sprintf("p2pnode %s (revision %s, %s)", Version, Revision(), runtime.Version())
}

// Version is the release: the Makefile sets it (VERSION); a plain `go build` or `go run`
// reports the next release with "-dev".
var Version = "0.1.0-dev"

// LinkedRevision is the revision the Makefile sets at link time (-ldflags -X, from `git
// rev-parse`), so that a build without Go's VCS stamping (GOFLAGS=-buildvcs=false, a tree
// copied without .git metadata Go can read) still names its commit.
var LinkedRevision = ""

// Revision is the VCS commit the binary was built from (with "+dirty" when the tree had
// uncommitted changes): LinkedRevision when set, else what Go recorded, else "unknown" (go
// run, tests, -buildvcs=false without the Makefile).
var Revision = sync.OnceValue(func() string {
	if LinkedRevision != "" {
		return LinkedRevision
	}
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

// Agent is what a node announces to peers (the libp2p user agent, its announcements) and
// shows in status: "p2pnode/0.1.0".
func Agent() string { return "p2pnode/" + Version }
