package p2p

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A damaged identity key is a start-up error naming the file, not a node whose every
// signature is invalid.
func TestLoadIdentityRefusesADamagedKey(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	good := filepath.Join(dir, "identity.key")
	key, err := LoadIdentity(good, log) // created
	require.NoError(t, err)
	raw, err := os.ReadFile(good)
	require.NoError(t, err)
	again, err := LoadIdentity(good, log)
	require.NoError(t, err)
	require.True(t, key.Equals(again), "the same key read back")

	flip := func(at int) []byte {
		b := append([]byte{}, raw...)
		b[at] ^= 0x01
		return b
	}
	tests := []struct {
		name string
		data []byte
		want string
	}{
		// protobuf header (4 bytes), then the 32-byte seed and the 32-byte public key
		{"seed byte flipped", flip(4 + 5), "damaged"},
		{"public key byte flipped", flip(len(raw) - 3), "damaged"},
		{"truncated", raw[:len(raw)-10], "not a libp2p private key"},
		{"garbage", []byte(strings.Repeat("x", 40)), "not a libp2p private key"},
		{"empty", []byte{}, "not a libp2p private key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "identity.key")
			require.NoError(t, os.WriteFile(path, tt.data, 0o600))
			_, err := LoadIdentity(path, log)
			require.Error(t, err)
			require.Contains(t, err.Error(), path)
			require.Contains(t, err.Error(), tt.want)
			got, rerr := os.ReadFile(path)
			require.NoError(t, rerr)
			require.Equal(t, tt.data, got, "a damaged key is left for the user to look at, never replaced")
		})
	}
}
