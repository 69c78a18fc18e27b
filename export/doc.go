// Package export owns model directories: a head's parameters written as an ordinary
// safetensors model (one file, or shards plus model.safetensors.index.json) that any
// safetensors reader loads, kept current in place by rewriting only the blocks that
// changed, crash-safely, and checked against a head. It also owns the background writer a
// running node uses to keep such a directory current without making rounds wait.
//
// Files it writes in the model directory (see docs/formats.md, "Model export"):
//
//	model.safetensors                      one file when the tensors fit in the shard size
//	model-00001-of-0000N.safetensors       shards, in pack (name) order, above it
//	model.safetensors.index.json           weight_map and metadata.total_size (shards only)
//	.p2pnode-export.journal                only while a sync is being applied
//	.p2pnode-export-*.tmp                  only while whole files are being written
//
// Every change to the directory is one transaction. New whole files are written to temp
// files and fsynced; changed blocks of files updated in place, the renames of the temp
// files and the removal of stale model files are recorded in the journal, which ends in a
// commit record holding the sha256 of everything before it. The journal is fsynced (and
// the directory) before the first byte of a model file changes; it is deleted only after
// every change is durable. Any later export, Recover or VerifyDir on the directory first
// re-applies a committed journal (every step is idempotent) or discards one that never
// reached its commit record (nothing had been touched yet), so after a crash at any
// moment the directory holds the old model or the new one, never a mix.
//
// The safetensors header of an exported file has a fixed length for a given layout and
// experiment: the fields that change from head to head (round, head and params CIDs) get
// a reserved width, the JSON is padded with spaces up to it. So an in-place sync never
// moves tensor data; the header is diffed and journaled like any other block.
//
// The same head always gives byte-identical files, on any node: the header is canonical
// JSON, the data is the canonical pack's data, shard assignment is a pure function of the
// layout and the shard size.
package export
