// Package artifact owns content-addressed artifacts: fixed-size chunks with CIDv1
// blake3-256 ids, the manifest whose CID (sha2-256) names the artifact, the on-disk
// store (one blob file per artifact, written once, read by mapping) and, on the network,
// the /p2ptrain/artifact/1.0.0 transfer protocol. It does not know what an artifact
// means.
//
// Exchange serves the store's artifacts to peers and fetches artifacts from them: the
// manifest first, verified against the id, then chunks spread over every known holder
// with a window of requests in flight per holder, each chunk hashed as it is read from
// the stream and written, by one writer, at its offset in a partial file that survives
// interruptions. The wire format is in docs/formats.md ("Artifact exchange").
package artifact
