// Package chain owns heads: the record of one version of the shared model, its canonical
// CBOR encoding and CID, validator signatures over that CID, and the local store of heads
// that lets a node walk the chain from any head back to genesis. Beside each head the store
// keeps the round notes its proposer signed (Notes: held-out metrics, rejections, the time
// split), which are not part of the head's CID and travel with it over head sync.
package chain
