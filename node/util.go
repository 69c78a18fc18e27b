package node

import (
	"fmt"
	"os"
)

// ensureWritableDir creates dir if needed and checks that files can be created in it, so
// that an unwritable store fails start-up in one line rather than deep inside a component.
func ensureWritableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cannot create %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".write-test-*")
	if err != nil {
		return fmt.Errorf("%s is not writable: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}
