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
	// Streams are written to the checkpoint's own store like Large blobs, and appear in
	// State.Blobs, but their bytes are read from the Source while the blob is written: a
	// model-sized state (a file on disk, a live buffer its source guards) is never copied
	// into memory. The checkpointer closes every Source it is handed (see Source.Close).
	Streams map[string]Source
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
	for name, src := range s.Streams {
		if name == "" || len(name) > maxNameBytes || !utf8.ValidString(name) {
			return fmt.Errorf("checkpoint round %d: blob name %q must be 1 to %d bytes of UTF-8", s.Round, name, maxNameBytes)
		}
		if src == nil {
			return fmt.Errorf("checkpoint round %d: blob %q has no source", s.Round, name)
		}
		if _, dup := s.Large[name]; dup {
			return fmt.Errorf("checkpoint round %d: blob %q is both in Large and in Streams", s.Round, name)
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
		if _, dup := s.Streams[name]; dup {
			return fmt.Errorf("checkpoint round %d: blob %q is both in Streams and in Keep", s.Round, name)
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

// release closes the snapshot's sources; the snapshot is done with (written, failed or
// dropped). Safe to call more than once.
func (s *Snapshot) release() {
	for _, name := range sortedKeys(s.Streams) {
		if src := s.Streams[name]; src != nil {
			src.Close()
		}
	}
	s.Streams = nil
}
