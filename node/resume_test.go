package node

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/status"
	"github.com/p2pnode/p2pnode/synth"
)

// logBuffer captures a node's log (text handler, info and above).
func logBuffer() (*slog.Logger, *syncBuffer) {
	var b syncBuffer
	return slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelInfo})), &b
}

// A node whose checkpoint generations are gone or all damaged resumes from the head
// chain it holds, at the round it had reached, and says so at WARN; it never starts the
// experiment over.
func TestSoloNodeResumesFromTheChainWithoutState(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, store string)
	}{
		{"state deleted", func(t *testing.T, store string) {
			require.NoError(t, os.RemoveAll(filepath.Join(store, "state")))
		}},
		{"every state file corrupted", func(t *testing.T, store string) {
			files, err := filepath.Glob(filepath.Join(store, "state", "state-*"))
			require.NoError(t, err)
			require.NotEmpty(t, files)
			for _, f := range files {
				require.NoError(t, os.WriteFile(f, []byte("garbage"), 0o644))
			}
		}},
		// The older generation names round 3's outer state, which the store keeps for the
		// tip only: it cannot be loaded either, and the node resumes from the chain.
		{"newest state file corrupted", func(t *testing.T, store string) {
			files, err := filepath.Glob(filepath.Join(store, "state", "state-*"))
			require.NoError(t, err)
			require.Len(t, files, 2, "node.keep_heads 2 keeps two generations")
			slices.Sort(files)
			require.NoError(t, os.WriteFile(files[len(files)-1], []byte("garbage"), 0o644))
		}},
		{"state and tip file deleted", func(t *testing.T, store string) {
			require.NoError(t, os.RemoveAll(filepath.Join(store, "state")))
			require.NoError(t, os.Remove(filepath.Join(store, TipFile)))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			synthDataset(t, filepath.Join(dir, "data"), 10)
			cfg := soloConfig(t, dir, 4)
			var out syncBuffer
			n := runNode(t, cfg, &out)
			require.Equal(t, uint64(4), n.Status().Round)
			head := n.Status().Head

			tt.damage(t, cfg.Node.StoreDir)
			cfg.Experiment.Rounds = 6
			log, logs := logBuffer()
			out = syncBuffer{}
			n, err := New(cfg, Options{Progress: &out, Runtime: synth.New(t.TempDir()), Logger: log})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			require.NoError(t, n.Run(ctx), logs.String())
			st := n.Status()
			require.Equal(t, uint64(6), st.Round)
			// The history (kept in the store across restarts) holds round 4 once, at the head
			// the first run reached; the progress output shows where this run started.
			i := slices.IndexFunc(st.History, func(p status.RoundPoint) bool { return p.Round == 4 })
			require.GreaterOrEqual(t, i, 0, "round 4 missing from the history")
			require.Equal(t, head, st.History[i].Head, "round 4's head changed: the run started over")
			require.Regexp(t, `^(dashboard +http://\S+/\n)?round   4/6`, out.String())
			var warned bool
			for _, line := range strings.Split(logs.String(), "\n") {
				warned = warned || strings.Contains(line, "level=WARN") && strings.Contains(line, "resumed from the head chain") && strings.Contains(line, "round=4")
			}
			require.True(t, warned, "no WARN line saying where the node resumed:\n%s", logs.String())
		})
	}
}

// A lone node whose tip head file is damaged or deleted, with no peer to replace it, falls
// back to the parent head it holds when it holds the parent's artifacts (EMA merges keep
// no outer state), and otherwise stops with an error that names the file and says how to
// recover (DiLoCo: the parent's outer state was pruned once the tip's was checkpointed).
func TestSoloNodeWithADamagedTipHead(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policy   string
		damage   func(t *testing.T, path string)
		fallback bool // resumes from the parent; else the start fails, saying how to recover
	}{
		{"damaged, ema", config.PolicyEMA, corruptFile, true},
		{"deleted, ema", config.PolicyEMA, removeFile, true},
		{"damaged, diloco", config.PolicyDiLoCo, corruptFile, false},
		{"deleted, diloco", config.PolicyDiLoCo, removeFile, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			synthDataset(t, filepath.Join(dir, "data"), 10)
			cfg := soloConfig(t, dir, 3)
			cfg.Protocol.MergePolicy = tc.policy
			n := runNode(t, cfg, &syncBuffer{})
			parent := n.Status().History
			stores, err := OpenStores(cfg)
			require.NoError(t, err)
			tip := mustDecode(t, n.Status().Head)
			path := stores.Heads.Path(tip)
			tc.damage(t, path)

			cfg.Experiment.Rounds = 5
			log, logs := logBuffer()
			var out syncBuffer
			n, err = New(cfg, Options{Progress: &out, Runtime: synth.New(t.TempDir()), Logger: log})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			err = n.Run(ctx)
			if !tc.fallback {
				require.Error(t, err)
				require.Contains(t, err.Error(), path, "the error names the head file")
				require.Contains(t, err.Error(), "to recover, start this node with a peer that holds head "+tip.String())
				require.Contains(t, err.Error(), "move "+cfg.Node.StoreDir+" aside")
				return
			}
			require.NoError(t, err, logs.String())
			require.Equal(t, uint64(5), n.Status().Round)
			i := slices.IndexFunc(parent, func(p status.RoundPoint) bool { return p.Round == 2 })
			require.GreaterOrEqual(t, i, 0)
			var resumed string
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, "resumed from the head chain") {
					resumed = l
				}
			}
			require.Contains(t, resumed, "round=2 head="+parent[i].Head, "did not resume from the parent:\n%s", logs.String())
			require.Contains(t, resumed, path, "the log names the unreadable file")
		})
	}
}

func corruptFile(t *testing.T, path string) {
	require.NoError(t, os.WriteFile(path, []byte("not a head"), 0o644))
}

func removeFile(t *testing.T, path string) { require.NoError(t, os.Remove(path)) }

// A validator restarted with its tip head file damaged gets the head again from a peer and
// the swarm finishes its rounds, where it used to refuse to start.
func TestRestartedValidatorRefetchesItsDamagedTipHead(t *testing.T) {
	const rounds = 6
	c := newCluster(t, 1, 2, rounds, 24)
	for _, n := range c.nodes {
		n.cfg.Lease.RoundTimeout = 10 * time.Second
	}
	for _, n := range c.nodes[1:] {
		n.rt.Delay = 500 * time.Millisecond // rounds slow enough for heads to reach everyone
	}
	v := c.nodes[0]
	v.logs = &syncBuffer{}
	c.startAll()
	// Kill the validator at a head both trainers hold: the peers it will ask.
	require.Eventually(t, func() bool {
		st := v.n.Status()
		if st.Round < 3 {
			return false
		}
		for _, n := range c.nodes[1:] {
			if n.n.Status().Head != st.Head {
				return false
			}
		}
		return true
	}, time.Minute, 5*time.Millisecond)
	c.kill(v)

	stores, err := OpenStores(v.cfg)
	require.NoError(t, err)
	tip, err := stores.ResolveHead("latest")
	require.NoError(t, err)
	for _, n := range c.nodes[1:] {
		ts, err := OpenStores(n.cfg)
		require.NoError(t, err)
		require.True(t, ts.Heads.Has(tip), "%s lacks the validator's tip: the kill came between two heads", n.name)
	}
	path := stores.Heads.Path(tip)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[len(b)/2] ^= 0xff
	require.NoError(t, os.WriteFile(path, b, 0o644))

	c.restart(v)
	c.waitDone(2 * time.Minute)
	c.requireOneChain(c.nodes, rounds)
	require.Contains(t, v.logs.String(), "damaged head replaced with a peer's copy")
	require.Contains(t, v.logs.String(), path)
}

// A restarted validator sets its first deadline from the trainer paces it checkpointed,
// not from lease.round_timeout: a trainer lost in that round costs seconds, not the
// whole timeout.
func TestRestartedValidatorKeepsItsPaces(t *testing.T) {
	const rounds, timeout = 8, 2 * time.Minute
	c := newCluster(t, 1, 2, rounds, 24)
	for _, n := range c.nodes {
		n.cfg.Lease.RoundTimeout = timeout
	}
	for _, n := range c.nodes[1:] {
		n.rt.Delay = 200 * time.Millisecond
	}
	v := c.nodes[0]
	c.startAll()
	require.Eventually(t, func() bool { return v.n.Status().Round >= 3 }, time.Minute, 10*time.Millisecond)
	c.kill(v)
	c.restart(v)
	restarted := time.Now()
	var window time.Duration
	require.Eventually(t, func() bool {
		vs := v.n.Status().Validator
		if vs == nil || len(vs.Leased) == 0 {
			return false
		}
		window = time.Until(vs.Deadline)
		return true
	}, time.Minute, 2*time.Millisecond, "no leases after the restart")
	t.Logf("first deadline after the restart: %v ahead (round_timeout %v); leases %v after the restart",
		window.Round(time.Millisecond), timeout, time.Since(restarted).Round(time.Millisecond))
	require.Less(t, window, timeout/4, "the first deadline after a restart came from round_timeout, not the trainers' paces")
	c.waitDone(2 * time.Minute)
	c.requireOneChain(c.nodes, rounds)
}
