package testenv

import (
	"bytes"
	"crypto/sha256"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Key is a fixed Ed25519 key made from a name, and its peer ID: the same name gives the
// same identity in every run (the pinned runs' head CIDs depend on it).
func Key(t testing.TB, name string) (crypto.PrivKey, string) {
	t.Helper()
	seed := sha256.Sum256([]byte("p2pnode pin " + name))
	k, _, err := crypto.GenerateEd25519Key(bytes.NewReader(append(seed[:], seed[:]...)))
	if err != nil {
		t.Fatalf("key %q: %v", name, err)
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatalf("key %q: %v", name, err)
	}
	return k, id.String()
}
