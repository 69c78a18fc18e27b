package node

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
	return key, nil
}

// PeerID is the peer id of a private key.
func PeerID(key crypto.PrivKey) (string, error) {
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return "", err
	}
	return id.String(), nil
}
