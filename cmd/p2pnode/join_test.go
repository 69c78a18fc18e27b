package main

import (
	"crypto/rand"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/invite"
)

// owner is a loopback libp2p host serving an experiment record.
type owner struct {
	h   host.Host
	key crypto.PrivKey
	srv *invite.Server
}

func newOwner(t *testing.T) *owner {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	return &owner{h: h, key: key}
}

func (o *owner) addr() string {
	return o.h.Addrs()[0].String() + "/p2p/" + o.h.ID().String()
}

// serve serves experiment bytes signed by key.
func (o *owner) serve(t *testing.T, key crypto.PrivKey, exp []byte) {
	t.Helper()
	r, err := invite.Sign(key, exp)
	require.NoError(t, err)
	if o.srv != nil {
		require.NoError(t, o.srv.Set(r))
		return
	}
	o.srv, err = invite.Serve(o.h, r, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
}

func experimentOf(t *testing.T, edit func(*config.Config), validators ...peer.ID) []byte {
	t.Helper()
	cfg := config.Default()
	for _, v := range validators {
		cfg.Experiment.Validators = append(cfg.Experiment.Validators, v.String())
	}
	if edit != nil {
		edit(cfg)
	}
	b, err := invite.Experiment(cfg, "")
	require.NoError(t, err)
	return b
}

func requireNothingWritten(t *testing.T, dir string) {
	t.Helper()
	_, err := os.Stat(dir)
	require.True(t, os.IsNotExist(err), "%s was created", dir)
}

func TestJoinRefusesBadInputAndWritesNothing(t *testing.T) {
	o := newOwner(t)
	otherKey, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	other, err := peer.IDFromPrivateKey(otherKey)
	require.NoError(t, err)

	for _, tc := range []struct {
		name  string
		setup func()
		addr  func() string
		says  string
	}{
		{"no peer id", func() {}, func() string { return o.h.Addrs()[0].String() }, "has no /p2p/<peer id>"},
		{"signed by no listed validator", func() { o.serve(t, o.key, experimentOf(t, nil, other)) }, o.addr,
			"not signed by one of its validators: signer " + o.h.ID().String() + " is not in experiment.validators"},
		{"signer is not the dialed peer", func() { o.serve(t, otherKey, experimentOf(t, nil, other, o.h.ID())) }, o.addr,
			"signed by a peer other than the one dialed: dialed " + o.h.ID().String() + ", signed by " + other.String()},
		{"not a valid config here", func() {
			o.serve(t, o.key, experimentOf(t, func(c *config.Config) { c.Experiment.Quorum = 2 }, o.h.ID()))
		}, o.addr, "experiment.quorum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup()
			dir := filepath.Join(t.TempDir(), "vol")
			code, _, errOut := execMain(t, "join", "--dir", dir, "--no-run", "--no-doctor", tc.addr())
			require.Equal(t, 1, code, errOut)
			require.Contains(t, errOut, tc.says)
			requireNothingWritten(t, dir)
		})
	}

	t.Run("tampered record", func(t *testing.T) {
		r, err := invite.Sign(o.key, experimentOf(t, nil, o.h.ID()))
		require.NoError(t, err)
		r.Experiment = []byte(strings.Replace(string(r.Experiment), "inner_steps: 20", "inner_steps: 21", 1))
		require.NoError(t, o.srv.Set(r))
		dir := filepath.Join(t.TempDir(), "vol")
		code, _, errOut := execMain(t, "join", "--dir", dir, "--no-run", "--no-doctor", o.addr())
		require.Equal(t, 1, code, errOut)
		require.Contains(t, errOut, "signature does not verify")
		requireNothingWritten(t, dir)
	})
}

func TestJoinWritesConfigReusesItAndRefusesAChangedExperiment(t *testing.T) {
	o := newOwner(t)
	o.serve(t, o.key, experimentOf(t, func(c *config.Config) { c.Experiment.ID = "lm" }, o.h.ID()))
	dir := filepath.Join(t.TempDir(), "vol")
	code, out, errOut := execMain(t, "join", "--dir", dir, "--no-run", "--no-doctor", "--device", "cpu", "--listen", "/ip4/0.0.0.0/tcp/4002", o.addr())
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "experiment  p2ptrain/lm")
	require.Contains(t, out, "wrote "+filepath.Join(dir, "p2pnode.yaml"))

	cfg, err := config.Load(filepath.Join(dir, "p2pnode.yaml"))
	require.NoError(t, err)
	require.Equal(t, []string{config.RoleTrainer}, cfg.Experiment.Roles)
	require.Equal(t, []string{o.h.ID().String()}, cfg.Experiment.Validators)
	require.Equal(t, []string{o.addr()}, cfg.Node.Bootstrap)
	require.Equal(t, []string{"/ip4/0.0.0.0/tcp/4002"}, cfg.Node.Listen)
	require.Equal(t, "cpu", cfg.Workload.Device)
	require.Equal(t, filepath.Join(dir, ".p2pnode"), cfg.Node.StoreDir)
	require.Equal(t, filepath.Join(dir, "data", "lm"), cfg.Dataset.Root)
	key, err := os.ReadFile(filepath.Join(dir, ".p2pnode", "identity.key"))
	require.NoError(t, err)

	// Again, unchanged: the same config and identity; the flags given before stay.
	code, out, errOut = execMain(t, "join", "--dir", dir, "--no-run", "--no-doctor", o.addr())
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "the experiment is unchanged")
	cfg, err = config.Load(filepath.Join(dir, "p2pnode.yaml"))
	require.NoError(t, err)
	require.Equal(t, "cpu", cfg.Workload.Device)
	again, err := os.ReadFile(filepath.Join(dir, ".p2pnode", "identity.key"))
	require.NoError(t, err)
	require.Equal(t, key, again)

	// The owner changes the experiment: refused, saying what changed, until --update.
	before, err := os.ReadFile(filepath.Join(dir, "p2pnode.yaml"))
	require.NoError(t, err)
	o.serve(t, o.key, experimentOf(t, func(c *config.Config) { c.Experiment.ID = "lm"; c.Protocol.InnerSteps = 40 }, o.h.ID()))
	code, _, errOut = execMain(t, "join", "--dir", dir, "--no-run", "--no-doctor", o.addr())
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "experiment changed since")
	require.Contains(t, errOut, "protocol.inner_steps: 20 → 40")
	after, err := os.ReadFile(filepath.Join(dir, "p2pnode.yaml"))
	require.NoError(t, err)
	require.Equal(t, before, after, "a refused update writes nothing")

	code, out, errOut = execMain(t, "join", "--dir", dir, "--no-run", "--no-doctor", "--update", o.addr())
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "updated")
	cfg, err = config.Load(filepath.Join(dir, "p2pnode.yaml"))
	require.NoError(t, err)
	require.Equal(t, 40, cfg.Protocol.InnerSteps)
	require.Equal(t, "cpu", cfg.Workload.Device, "node-local settings survive an update")

	// The validator gone: the joined experiment starts as it was.
	addr := o.addr()
	require.NoError(t, o.h.Close())
	code, out, errOut = execMain(t, "join", "--dir", dir, "--no-run", "--no-doctor", addr)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "could not reach")
}

func TestJoinRefusesAConfigItDidNotWrite(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "p2pnode.yaml"), config.Template, 0o644))
	code, _, errOut := execMain(t, "join", "--dir", dir, "--no-run", "--no-doctor", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWGs7fzghcbnMn1A3hMgmCXiksCseBuSj7V7WEbmiH7YWU")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "was not written by join")
}

func TestInitOwnerNamesItselfAndFixesPorts(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := execMain(t, "init", "--owner", "--port", "4711", "--dir", dir)
	require.Equal(t, 0, code, errOut)
	cfg, err := config.Load(filepath.Join(dir, "p2pnode.yaml"))
	require.NoError(t, err)
	id := strings.Fields(strings.SplitN(out, "peer id ", 2)[1])[0]
	require.Equal(t, []string{id}, cfg.Experiment.Validators)
	require.Equal(t, []string{"/ip4/0.0.0.0/tcp/4711", "/ip4/0.0.0.0/udp/4711/quic-v1"}, cfg.Node.Listen)
	require.True(t, cfg.Experiment.HasRole(config.RoleBootstrap))

	code, out, errOut = execMain(t, "invite", "--config", filepath.Join(dir, "p2pnode.yaml"))
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `p2pnode join /ip[46]/[^ ]+/(tcp|udp)/4711/[^ ]*p2p/`+id, out)

	code, _, errOut = execMain(t, "init", "--owner", "--port", "0", "--dir", t.TempDir())
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "--port: 0 is not a port")
}

// join checks the machine first: a failed check stops it before anything is written.
func TestJoinRunsDoctorFirst(t *testing.T) {
	o := newOwner(t)
	o.serve(t, o.key, experimentOf(t, nil, o.h.ID()))
	dir := filepath.Join(t.TempDir(), "vol")
	t.Setenv("P2PNODE_WORKLOAD_INTERPRETER", filepath.Join(t.TempDir(), "no-python"))
	code, out, errOut := execMain(t, "join", "--dir", dir, "--no-run", o.addr())
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "FAIL  interpreter")
	require.Contains(t, out, "fix: set workload.interpreter")
	require.Contains(t, errOut, "fix what doctor says FAIL above")
	requireNothingWritten(t, dir)
}

// An environment override of node.store_dir moves the identity with it: the key join
// makes is the one the node then runs with.
func TestJoinKeepsTheIdentityWhereTheNodeLooks(t *testing.T) {
	o := newOwner(t)
	o.serve(t, o.key, experimentOf(t, nil, o.h.ID()))
	dir := filepath.Join(t.TempDir(), "vol")
	store := filepath.Join(t.TempDir(), "store")
	t.Setenv("P2PNODE_NODE_STORE_DIR", store)
	code, _, errOut := execMain(t, "join", "--dir", dir, "--no-run", "--no-doctor", o.addr())
	require.Equal(t, 0, code, errOut)
	_, err := os.Stat(filepath.Join(store, "identity.key"))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, ".p2pnode", "identity.key"))
	require.True(t, os.IsNotExist(err))
}

func TestJoinPrintsWhatItWillDownload(t *testing.T) {
	o := newOwner(t)
	o.serve(t, o.key, experimentOf(t, func(c *config.Config) { c.Experiment.ID = "lm"; c.Dataset.Prepare = false }, o.h.ID()))
	o.srv.SetSizes(func() (invite.Sizes, bool) {
		return invite.Sizes{Round: 7, Params: 124_000_000, ParamsBytes: 496_001_024, DatasetBytes: 3 << 30, DatasetFiles: 12}, true
	})
	dir := filepath.Join(t.TempDir(), "vol")
	code, out, errOut := execMain(t, "join", "--dir", dir, "--no-run", "--no-doctor", o.addr())
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "124 M parameters, 473 MiB to download (the head of round 7)")
	require.Contains(t, out, "3.00 GiB in 12 files")
	require.Contains(t, out, "download    3.46 GiB (the parameters and the dataset)")
}

func TestWriteJoinSizes(t *testing.T) {
	sz := &invite.Sizes{Round: 3, Params: 1000, ParamsBytes: 1 << 20, DatasetBytes: 10 << 20, DatasetFiles: 2}
	for _, tc := range []struct {
		name    string
		sz      *invite.Sizes
		prepare bool
		keep    int
		sparse  bool // protocol.codec: sparse
		want    string
	}{
		{"none reported", nil, false, 3, false, "download    size not reported by the validator"},
		{"no head, no dataset", &invite.Sizes{}, false, 3, false, "download    size not reported by the validator"},
		{"from peers", sz, false, 3, false, "download    11.0 MiB (the parameters and the dataset); disk needed about 13.0 MiB (the dataset and node.keep_heads=3 heads' parameters)"},
		{"prepared here", sz, true, 5, false, "download    1.00 MiB (the parameters); disk needed about 15.0 MiB (the dataset and node.keep_heads=5 heads' parameters)"},
		{"dataset unknown", &invite.Sizes{Round: 3, Params: 1000, ParamsBytes: 1 << 20}, false, 2, false, "download    1.00 MiB (the parameters); disk needed about 2.00 MiB"},
		{"sparse", sz, false, 2, true, "download    12.0 MiB (the parameters and outer state and the dataset); disk needed about 15.0 MiB (the dataset and node.keep_heads=2 heads' parameters, the tip's outer state and the anchor head's parameters and outer state)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Dataset.Prepare = tc.prepare
			cfg.Node.KeepHeads = tc.keep
			if tc.sparse {
				cfg.Protocol.Codec = diloco.Sparse
			}
			var b strings.Builder
			writeJoinSizes(&b, tc.sz, cfg)
			require.Contains(t, b.String(), tc.want)
		})
	}
}
