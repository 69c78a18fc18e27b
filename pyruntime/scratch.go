package pyruntime

import (
	"fmt"
	"os"
)

// makeScratch returns the scratch directory and whether we created it (and so remove it
// on Close). Packs live here; tmpfs keeps them out of the disk's way.
func makeScratch(dir string) (string, bool, error) {
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", false, fmt.Errorf("pyruntime: scratch dir %s: %w", dir, err)
		}
		return dir, false, nil
	}
	var last error
	for _, base := range scratchBases() {
		d, err := newScratchDir(base)
		if err == nil {
			return d, true, nil
		}
		last = err
	}
	return "", false, fmt.Errorf("pyruntime: scratch dir: %w", last)
}
