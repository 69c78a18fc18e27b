package checkpoint

import (
	"fmt"
	"maps"
	"slices"
	"unicode/utf8"

	"github.com/ipfs/go-cid"
)

// Snapshot is the state a caller asks to save. Large holds copies of the live buffers
// (the caller makes them, e.g. between training steps), so the writer can take its time.
type Snapshot struct {
	Round uint64
	Head  string
	Meta  map[string]string
	// Large blobs are written to the checkpoint's own store and appear in State.Blobs.
	Large map[string][]byte
	// Keep names artifacts already in the shared store, referenced as-is in State.Refs
	// (e.g. the head's outer-optimizer state, which the node stores anyway).
	Keep map[string]cid.Cid
}

// check refuses a snapshot whose state file could not be written or loaded back,
// before any blob is written for it.
func (c *Checkpointer) check(s *Snapshot) error {
	for name := range s.Large {
		if name == "" || len(name) > maxNameBytes || !utf8.ValidString(name) {
			return fmt.Errorf("checkpoint round %d: blob name %q must be 1 to %d bytes of UTF-8", s.Round, name, maxNameBytes)
		}
	}
	probe := &State{Head: s.Head, Meta: s.Meta, Refs: s.Keep}
	if err := probe.validate(); err != nil {
		return fmt.Errorf("checkpoint round %d: %w", s.Round, err)
	}
	for _, name := range sortedKeys(s.Keep) {
		id := s.Keep[name]
		if _, dup := s.Large[name]; dup {
			return fmt.Errorf("checkpoint round %d: blob %q is both in Large and in Keep", s.Round, name)
		}
		if c.shared == nil {
			return fmt.Errorf("checkpoint round %d: kept blob %q (%s): no shared artifact store", s.Round, name, id)
		}
		// A reference to a missing artifact would make the generation unloadable.
		if !c.shared.Has(id) {
			return fmt.Errorf("checkpoint round %d: kept blob %q: artifact %s not in the shared store", s.Round, name, id)
		}
	}
	return nil
}

// sortedKeys gives a fixed order, so blobs are written and errors reported the same way
// every time.
func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
