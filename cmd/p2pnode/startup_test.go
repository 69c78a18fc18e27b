package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/internal/version"
)

// exec runs the p2pnode command line in-process and returns its exit status, stdout and
// stderr.
func execMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := runMain(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestVersionFlagAndCommand(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}} {
		code, out, _ := execMain(t, args...)
		require.Equal(t, 0, code, args)
		require.Equal(t, version.String()+"\n", out, args)
		require.True(t, strings.HasPrefix(out, "p2pnode "+version.Version+" (revision "), out)
	}
}

// writeConfig writes a loopback config into dir after edit, without validating it (the
// point is what `p2pnode run` says about it).
func writeConfig(t *testing.T, dir string, edit func(*config.Config)) string {
	t.Helper()
	cfg := config.Default()
	cfg.Node.StoreDir = filepath.Join(dir, "store")
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	cfg.Node.HTTP = "127.0.0.1:0"
	cfg.Node.DHT = false
	cfg.Dataset.Root = filepath.Join(dir, "data")
	cfg.Dataset.Manifest = filepath.Join(dir, "data", "manifest.json")
	edit(cfg)
	b, err := yaml.Marshal(cfg)
	require.NoError(t, err)
	path := filepath.Join(dir, "p2pnode.yaml")
	require.NoError(t, os.WriteFile(path, b, 0o644))
	return path
}

// The mistakes a new user makes fail `p2pnode run` with one line naming the setting, and
// nothing from fx (no reflect stubs, no "OnStart hook failed", no error-level logs).
func TestStartupErrorsAreOneLineNamingTheSetting(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	busyTCP, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busyTCP.Close()
	notADir := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(notADir, nil, 0o644))
	badKey := filepath.Join(t.TempDir(), "bad.key")
	require.NoError(t, os.WriteFile(badKey, []byte("not a key"), 0o600))

	for _, tc := range []struct {
		name string
		edit func(*config.Config)
		want []string
	}{
		{"http port in use", func(c *config.Config) { c.Node.HTTP = busy.Addr().String() },
			[]string{"node.http: " + busy.Addr().String() + " is already in use", "port 0 for a free one"}},
		{"p2p port in use", func(c *config.Config) {
			c.Node.Listen = []string{"/ip4/127.0.0.1/tcp/" + portOf(busyTCP), "/ip4/127.0.0.1/udp/0/quic-v1"}
		}, []string{"node.listen[0]: could not listen on /ip4/127.0.0.1/tcp/" + portOf(busyTCP), "is already in use"}},
		{"unwritable store", func(c *config.Config) { c.Node.StoreDir = filepath.Join(notADir, "store") },
			[]string{"node.store_dir: cannot create " + filepath.Join(notADir, "store")}},
		{"bad identity", func(c *config.Config) { c.Node.Identity = badKey },
			[]string{"node.identity: identity " + badKey + " is not a libp2p private key"}},
		{"bad psk", func(c *config.Config) { c.Node.PSK = "secret" }, []string{"node.psk: must be 64 hex characters"}},
		{"quorum without validators", func(c *config.Config) { c.Experiment.Quorum = 3 },
			[]string{"experiment.quorum: 3 needs experiment.validators to list at least 3 peer ids"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, t.TempDir(), tc.edit)
			code, _, stderr := execMain(t, "run", "--config", path, "--log-format", "text")
			require.Equal(t, 1, code, stderr)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			last := lines[len(lines)-1]
			require.True(t, strings.HasPrefix(last, "p2pnode: "), "the error is not the last line:\n%s", stderr)
			for _, w := range tc.want {
				require.Contains(t, last, w)
			}
			for _, l := range lines {
				for _, noise := range []string{"reflect.", "makeFuncStub", "OnStart hook failed", "level=ERROR", "pkg=fx", "could not build arguments"} {
					require.NotContains(t, l, noise, "fx internals in the output:\n%s", stderr)
				}
			}
			require.Equal(t, 1, strings.Count(stderr, tc.want[0]), "the error is reported more than once:\n%s", stderr)
			t.Logf("%s", last)
		})
	}
}

func portOf(l net.Listener) string {
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// `p2pnode init` writes a config that stops after a finite, documented number of rounds.
func TestInitWritesAFiniteRun(t *testing.T) {
	dir := t.TempDir()
	code, out, stderr := execMain(t, "init", "--dir", dir)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "run it with: p2pnode run --config")
	cfg, err := config.Load(filepath.Join(dir, "p2pnode.yaml"))
	require.NoError(t, err)
	require.Equal(t, config.DefaultRounds, cfg.Experiment.Rounds)
	require.Positive(t, cfg.Experiment.Rounds)
	b, err := os.ReadFile(filepath.Join(dir, "p2pnode.yaml"))
	require.NoError(t, err)
	require.Contains(t, string(b), "0 runs until")
}

// `p2pnode status` on a node that is not running says so, not "connection refused".
func TestStatusOfAStoppedNode(t *testing.T) {
	dir := t.TempDir()
	path := writeConfig(t, dir, func(*config.Config) {})
	code, _, stderr := execMain(t, "status", "--config", path)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "the node of "+path+" is not running (it stopped, or never started")
	_, err := os.Stat(filepath.Join(dir, "store", "heads"))
	require.True(t, os.IsNotExist(err), "status created a store")

	// A node that died without cleaning up left its address behind: nothing answers there.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "store"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "store", "http.addr"), []byte(addr+"\n"), 0o644))
	code, _, stderr = execMain(t, "status", "--config", path)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "is not running: nothing answers at "+addr)
	require.NotContains(t, stderr, "connection refused")
}

func TestFleetConfigCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "fleet")
	code, out, stderr := execMain(t, "fleet-config", "--dir", dir, "--trainers", "2", "--rounds", "5")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "wrote 4 node configs to "+dir) // validator, 2 trainers, attacker
	for _, name := range []string{"validator", "trainer-1", "trainer-2", "dataset"} {
		cfg, err := config.Load(filepath.Join(dir, name+".yaml"))
		require.NoError(t, err, name)
		require.Equal(t, 5, cfg.Experiment.Rounds, name)
	}
}

func TestStopStatus(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cause error
		want  int
	}{
		{"ctrl-c", interrupted{os.Interrupt}, 130},
		{"sigterm from a supervisor", interrupted{syscall.SIGTERM}, 0},
		{"cancelled without a signal", context.Canceled, 130},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stopStatus(tc.cause); got != tc.want {
				t.Fatalf("stopStatus(%v) = %d, want %d", tc.cause, got, tc.want)
			}
		})
	}
}

// The first signal says once that the node is stopping, and cancels the run with the
// signal as the cause; the handler is released so that a second Ctrl-C kills at once.
func TestStopOnSignalSaysSoOnce(t *testing.T) {
	for _, sig := range []os.Signal{os.Interrupt, syscall.SIGTERM} {
		sigs := make(chan os.Signal, 2)
		ctx, cancel := context.WithCancelCause(context.Background())
		var out bytes.Buffer
		released := false
		sigs <- sig
		sigs <- sig
		stopOnSignal(sigs, func() { released = true }, cancel, &out)
		require.True(t, released)
		require.Equal(t, interrupted{sig}, context.Cause(ctx))
		require.Equal(t, 1, strings.Count(out.String(), "\n"), out.String())
		require.Contains(t, out.String(), "stopping…")
	}
}

// In a terminal, per-round INFO detail (records with a round) is debug: hidden at info,
// shown as DEBUG at debug; warnings and lines without a round stay as they are. Without
// --log-level (quiet), every INFO record is detail: the terminal shows warnings and the
// command's own lines.
func TestTerminalDemotesRoundDetail(t *testing.T) {
	for _, tc := range []struct {
		level slog.Level
		quiet bool
		want  []string
	}{
		{slog.LevelInfo, false, []string{`level=INFO msg=listening pkg=node`, `level=WARN msg="contribution rejected" pkg=node round=3`}},
		{slog.LevelDebug, false, []string{`level=DEBUG msg=trained pkg=node round=3`, `level=INFO msg=listening pkg=node`, `level=WARN msg="contribution rejected" pkg=node round=3`}},
		{slog.LevelInfo, true, []string{`level=WARN msg="contribution rejected" pkg=node round=3`}},
		{slog.LevelDebug, true, []string{`level=DEBUG msg=trained pkg=node round=3`, `level=DEBUG msg=listening pkg=node`, `level=WARN msg="contribution rejected" pkg=node round=3`}},
	} {
		var b bytes.Buffer
		log := slog.New(roundDetail{Handler: slog.NewTextHandler(&b, &slog.HandlerOptions{Level: tc.level}), quiet: tc.quiet}).With("pkg", "node")
		log.Info("trained", "round", 3)
		log.Info("listening")
		log.Warn("contribution rejected", "round", 3)
		lines := strings.Split(strings.TrimSpace(b.String()), "\n")
		require.Len(t, lines, len(tc.want), b.String())
		for i, w := range tc.want {
			require.Contains(t, lines[i], w)
		}
	}
}
