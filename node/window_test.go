package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/dataset"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/internal/synth"
	"github.com/p2pnode/p2pnode/lease"
)

func TestConfigBatch(t *testing.T) {
	cases := []struct {
		name string
		cfg  map[string]any
		want int
	}{
		{"absent", map[string]any{"hidden": 128}, 0},
		{"nil config", nil, 0},
		{"int", map[string]any{"batch_size": 32}, 32},
		{"whole float", map[string]any{"batch_size": 32.0}, 32},
		{"fractional float", map[string]any{"batch_size": 32.5}, 0},
		{"zero", map[string]any{"batch_size": 0}, 0},
		{"negative", map[string]any{"batch_size": -4}, 0},
		{"string", map[string]any{"batch_size": "32"}, 0},
		{"too large", map[string]any{"batch_size": 1e12}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, configBatch(tc.cfg))
		})
	}
}

// The samples per step come from a proposal's candidates and the steps of the leases they
// name; a candidate naming a lease the proposal does not list counts for nothing.
func TestObserveWindows(t *testing.T) {
	l := func(trainer string, steps uint32) lease.Lease {
		return lease.Lease{Round: 2, Trainer: trainer, Microshards: []uint32{1}, Steps: steps}
	}
	la, lb, lc := l("a", 20), l("b", 14), l("c", 20)
	cand := func(ls lease.Lease, samples uint64) gossip.Candidate {
		return gossip.Candidate{Peer: ls.Trainer, Lease: ls.ID().Bytes(), Samples: samples}
	}
	cases := []struct {
		name   string
		before int
		p      *gossip.Proposal
		want   int
	}{
		{"no proposal keeps the value", 7, nil, 7},
		{"full and tail windows", 0, &gossip.Proposal{Leases: []lease.Lease{la, lb},
			Candidates: []gossip.Candidate{cand(la, 640), cand(lb, 448)}}, 32},
		{"a lease not in the proposal", 7, &gossip.Proposal{Leases: []lease.Lease{la},
			Candidates: []gossip.Candidate{cand(lc, 640)}}, 7},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := &validator{stepSamples: tc.before}
			v.observeWindows(tc.p)
			require.Equal(t, tc.want, v.stepSamples)
		})
	}
}

// withExamples writes examples.json for the synthetic dataset in dir (each file holds
// synth.ExamplesPerShard examples) and rebuilds its manifest, so that the plan knows how
// many samples a microshard holds.
func withExamples(t *testing.T, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "shard-*.bin"))
	require.NoError(t, err)
	counts := map[string]int{}
	for _, f := range files {
		counts[filepath.Base(f)] = synth.ExamplesPerShard
	}
	b, err := json.Marshal(counts)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, dataset.ExamplesFile), b, 0o644))
	m, err := dataset.Build(dir, "synth", 1<<20)
	require.NoError(t, err)
	require.NoError(t, m.Write(filepath.Join(dir, dataset.ManifestFile)))
}

// A window of inner_steps × batch samples needs more microshards than
// lease.microshards_per_trainer when they are small: the synthetic workload's 10 steps of 8
// take 80 samples, and its microshards hold 32, so a trainer is leased ceil(80/32) = 3, not
// the configured 2. Without workload.config.batch_size the leaders learn the 8 from the
// first merged round (both validators, whichever leads); with it, from round 1.
func TestMocknetLeasesHoldAWindow(t *testing.T) {
	cases := []struct {
		name  string
		batch any // workload.config.batch_size (nil: absent)
		want  []int
	}{
		{"learned from the first round", nil, []int{2, 3, 3, 3}},
		{"from workload.config.batch_size", 8, []int{3, 3, 3, 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 2, 2, len(tc.want), 40)
			withExamples(t, filepath.Join(c.dir, "data"))
			for _, n := range c.nodes {
				n.cfg.Lease.MinGroup = 2 // both trainers in every round
				if tc.batch != nil {
					n.cfg.Workload.Config = map[string]any{"batch_size": tc.batch}
				}
				require.NoError(t, n.cfg.Validate())
			}
			c.startAll()
			c.waitDone(2 * time.Minute)
			ref := c.nodes[0].n.Status()
			require.Equal(t, uint64(len(tc.want)), ref.Round)
			stores, err := OpenStores(c.nodes[0].cfg)
			require.NoError(t, err)
			_, heads, err := stores.Heads.Chain(mustDecode(t, ref.Head))
			require.NoError(t, err)
			for r, h := range heads[1:] {
				require.Len(t, h.Contributions, 2, "round %d", r+1)
				for _, ct := range h.Contributions {
					require.Len(t, ct.Microshards, tc.want[r], "round %d: %s's lease", r+1, ct.Peer)
				}
			}
			rep, err := stores.Audit(mustDecode(t, ref.Head))
			require.NoError(t, err)
			require.Zero(t, rep.Duplicated)
		})
	}
}
