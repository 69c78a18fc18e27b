// Package checkpoint owns a node's durable role state: its current head, round, small
// metadata and named large blobs (outer momentum, inner optimizer state, error-feedback
// residual). It writes generations atomically, from snapshots, on a background writer so
// training does not wait, and on start resumes from the newest generation that verifies.
//
// On disk, in the checkpoint directory:
//
//	LOCK                      flock held while a Checkpointer is open
//	state-<seq, 20 digits>.cbor  one generation: deterministic CBOR (see state.go)
//	blobs/                    an artifact store holding only blobs this package wrote
//
// A generation is written blobs first (each durable before the state file names it), then
// the state file by temp file, fsync, rename, fsync dir. A crash at any point leaves the
// previous generations intact; at worst some unreferenced blobs, which the next save
// removes. The last three generations are kept (KeepGenerations changes that), so one
// damaged state file or blob costs one generation, not the node's progress.
//
// Model-sized state is streamed: Snapshot.Streams blobs are read from their Source (an open
// file, a buffer the source guards) block by block while they are written, so a
// checkpoint of a 4 GB state costs the writer a 1 MiB buffer, not a copy.
//
// Blob ownership: Snapshot.Large and Snapshot.Streams blobs go into the checkpoint's own artifact store, and
// only those are ever deleted (when no kept generation references them). Snapshot.Keep
// references artifacts in the node's shared store (a head's params, say) and is never
// deleted here. Deleting from the shared store would be unsafe however carefully it is
// tagged: it is content-addressed, so a head or contribution whose bytes happen to equal
// a checkpoint blob shares the same file, and a Put of existing bytes is silently a no-op
// that leaves no trace of the second owner. The node prunes the shared store itself, by
// marking what is live (the Refs of the kept generations among it) and sweeping the rest;
// AfterPrune hands it the kept generations once a new one is durable, so that nothing a
// kept generation names is swept and a crash never leaves a checkpoint naming an artifact
// already gone.
package checkpoint
