// Package chain owns heads: the record of one version of the shared model, its canonical
// CBOR encoding and CID, validator signatures over that CID, and the local store of heads
// that lets a node walk the chain from any head back to genesis.
package chain
