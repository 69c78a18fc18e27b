// Package dataset owns the dataset manifest (manifest.json: every file's path, size, example
// count and artifact id), the microshard planner that cuts a manifest into content-addressed
// microshards, and the shard store that turns a microshard into verified local file paths —
// from the artifact store, the dataset directory, or peers through a Fetcher. It knows
// nothing about models: shard files are opaque bytes identified by CID.
//
// The formats are specified in docs/formats.md, section "Dataset manifest".
package dataset
