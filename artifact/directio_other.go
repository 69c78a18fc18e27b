//go:build !linux

package artifact

import "os"

// openDirect is unavailable here: chunks go through the page cache.
func openDirect(string) *os.File { return nil }
