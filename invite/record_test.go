package invite

import (
	"crypto/rand"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
)

func newKey(t testing.TB) (crypto.PrivKey, peer.ID) {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	id, err := peer.IDFromPrivateKey(k)
	require.NoError(t, err)
	return k, id
}

// ownerConfig is a validator's loaded config with node-local settings and secrets set, so
// that the tests can check none of them travel.
func ownerConfig(validators ...string) *config.Config {
	cfg := config.Default()
	cfg.Experiment.ID = "lm"
	cfg.Experiment.Validators = validators
	cfg.Experiment.Roles = []string{config.RoleValidator, config.RoleBootstrap}
	cfg.Node.PSK = "secret-psk"
	cfg.Node.Listen = []string{"/ip4/0.0.0.0/tcp/4001"}
	cfg.Workload.Env = map[string]string{"HF_TOKEN": "secret-token"}
	cfg.Workload.Interpreter = "/opt/owner/venv/bin/python"
	cfg.Workload.Config = map[string]any{"preset": "small", "lr": 0.001}
	cfg.Protocol.Codec = "sparse"
	cfg.Resolve("/home/owner/exp")
	return cfg
}

func TestRecordRoundTripCarriesOnlySharedKeys(t *testing.T) {
	key, self := newKey(t)
	cfg := ownerConfig()
	exp, err := Experiment(cfg, self.String())
	require.NoError(t, err)
	for _, secret := range []string{"secret-psk", "secret-token", "/opt/owner", "/home/owner", "4001", "bootstrap", "roles"} {
		require.NotContains(t, string(exp), secret)
	}
	again, err := Experiment(cfg, self.String())
	require.NoError(t, err)
	require.Equal(t, exp, again, "the same config makes the same bytes (a stable experiment id)")

	r, err := Sign(key, exp)
	require.NoError(t, err)
	b, err := Encode(r)
	require.NoError(t, err)
	got, err := Decode(b)
	require.NoError(t, err)
	j, err := Verify(got, self)
	require.NoError(t, err)
	require.Equal(t, ID(exp), j.ID)
	require.Equal(t, []string{self.String()}, j.Config.Experiment.Validators, "a config without validators names its own node")
	require.Equal(t, "lm", j.Config.Experiment.ID)
	require.Equal(t, cfg.Protocol, j.Config.Protocol)
	require.Equal(t, cfg.Merge, j.Config.Merge)
	require.Equal(t, cfg.Lease, j.Config.Lease)
	require.Equal(t, cfg.Workload.Config, j.Config.Workload.Config)
	require.Equal(t, "manifest.json", j.Config.Dataset.Manifest, "the manifest relative to the joining node's dataset.root")
	require.Equal(t, config.Default().Node, j.Config.Node, "node-local settings are the defaults")
	require.Equal(t, config.Default().Workload.Interpreter, j.Config.Workload.Interpreter)
}

func TestVerifyRefusesWithTheReason(t *testing.T) {
	key, self := newKey(t)
	otherKey, other := newKey(t)
	_, third := newKey(t)
	expFor := func(validators ...string) []byte {
		b, err := Experiment(ownerConfig(validators...), self.String())
		require.NoError(t, err)
		return b
	}
	sign := func(k crypto.PrivKey, exp []byte) *Record {
		r, err := Sign(k, exp)
		require.NoError(t, err)
		return r
	}
	tampered := sign(key, expFor(self.String()))
	tampered.Experiment = append([]byte(nil), tampered.Experiment...)
	tampered.Experiment[len(tampered.Experiment)-2] ^= 1
	forged := sign(key, expFor(self.String()))
	forged.Signer = other.String() // claims another validator signed it
	for _, tc := range []struct {
		name   string
		r      *Record
		dialed peer.ID
		want   error
		says   string
	}{
		{"signed by no listed validator", sign(otherKey, expFor(self.String())), other, ErrNotValidator, other.String()},
		{"signer is not the dialed peer", sign(otherKey, expFor(self.String(), other.String())), self, ErrNotDialed, "dialed " + self.String()},
		{"dialed a validator, signed by a third peer", sign(key, expFor(self.String())), third, ErrNotDialed, "signed by " + self.String()},
		{"tampered experiment", tampered, self, ErrBadSignature, self.String()},
		{"signer swapped", forged, other, ErrBadSignature, other.String()},
		{"sets a node-local key", sign(key, append(expFor(self.String()), "node:\n  listen: [/ip4/0.0.0.0/tcp/1]\n"...)), self, ErrMalformed, "it sets node,"},
		{"sets the interpreter", sign(key, []byte("experiment:\n  validators: ["+self.String()+"]\nworkload:\n  interpreter: /tmp/evil\n")), self, ErrMalformed, "workload.interpreter"},
		{"no validators", sign(key, []byte("experiment:\n  id: x\n")), self, ErrNotValidator, "names no validators"},
		{"not a config", sign(key, []byte("experiment:\n  quorum: many\n  validators: ["+self.String()+"]\n")), self, ErrMalformed, "experiment.quorum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Verify(tc.r, tc.dialed)
			require.ErrorIs(t, err, tc.want)
			require.ErrorContains(t, err, tc.says)
		})
	}
}

func TestDecodeRefusesMalformed(t *testing.T) {
	key, _ := newKey(t)
	r, err := Sign(key, []byte("experiment: {}\n"))
	require.NoError(t, err)
	good, err := Encode(r)
	require.NoError(t, err)
	future := *r
	future.Version = 2
	fb, err := Encode(&future)
	require.NoError(t, err)
	for name, b := range map[string][]byte{
		"empty":          nil,
		"not cbor":       []byte("experiment: {}"),
		"trailing bytes": append(append([]byte(nil), good...), 0),
		"truncated":      good[:len(good)-3],
		"newer version":  fb,
		"oversized":      make([]byte, MaxRecordBytes+1),
	} {
		_, err := Decode(b)
		require.ErrorIs(t, err, ErrMalformed, name)
	}
}

func FuzzDecodeVerify(f *testing.F) {
	key, self := newKey(f)
	exp, err := Experiment(ownerConfig(), self.String())
	require.NoError(f, err)
	r, err := Sign(key, exp)
	require.NoError(f, err)
	good, err := Encode(r)
	require.NoError(f, err)
	f.Add(good)
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Decode(b)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		j, err := Verify(r, self)
		if err != nil {
			return
		}
		// Whatever verifies was signed by the dialed validator and carries only shared keys.
		require.Contains(t, j.Config.Experiment.Validators, self.String())
		require.Equal(t, config.Default().Node, j.Config.Node)
	})
}
