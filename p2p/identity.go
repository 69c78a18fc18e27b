package p2p

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/internal/atomicfile"
)

// LoadIdentity reads the node's private key from path, creating an Ed25519 key (mode 0600)
// when the file does not exist.
func LoadIdentity(path string, log *slog.Logger) (crypto.PrivKey, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("generate identity: %w", err)
		}
		raw, err := crypto.MarshalPrivateKey(key)
		if err != nil {
			return nil, fmt.Errorf("encode identity: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("write identity %s: %w", path, err)
		}
		if err := atomicfile.Write(path, raw, 0o600); err != nil {
			return nil, fmt.Errorf("write identity: %w", err)
		}
		log.Info("created identity", "path", path)
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read identity %s: %w", path, err)
	}
	if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
		log.Warn("identity key is readable by other users; run chmod 600", "path", path, "mode", st.Mode().Perm().String())
	}
	key, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("identity %s is not a libp2p private key: %w", path, err)
	}
	if err := selfCheck(key); err != nil {
		return nil, fmt.Errorf("identity %s is damaged: %w; restore it from a backup, or delete it to start under a new peer id", path, err)
	}
	return key, nil
}

// selfCheck signs a message with key and verifies it with the key's public half. An
// Ed25519 key file holds the seed and the public key side by side: with the seed damaged
// the key still decodes and still names the same peer, but every signature it makes is
// invalid, and the node would be ignored by everyone without knowing why.
func selfCheck(key crypto.PrivKey) error {
	msg := []byte("p2pnode identity self-check")
	sig, err := key.Sign(msg)
	if err != nil {
		return fmt.Errorf("cannot sign: %w", err)
	}
	ok, err := key.GetPublic().Verify(msg, sig)
	if err != nil || !ok {
		return errors.New("its signatures do not verify with its own public key")
	}
	return nil
}

// PeerID is the peer id of a private key.
func PeerID(key crypto.PrivKey) (string, error) {
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return "", err
	}
	return id.String(), nil
}
