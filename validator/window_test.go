package validator

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/dataset"
)

func TestSamplesPerStep(t *testing.T) {
	cases := []struct {
		name   string
		field  int
		config map[string]any
		want   int
	}{
		{"lease.samples_per_step wins", 48, map[string]any{"batch_size": 32}, 48},
		{"batch_size from yaml", 0, map[string]any{"batch_size": 32}, 32},
		{"batch_size as a float", 0, map[string]any{"batch_size": 16.0}, 16},
		{"batch_size as uint64", 0, map[string]any{"batch_size": uint64(8)}, 8},
		{"fractional batch_size", 0, map[string]any{"batch_size": 2.5}, 0},
		{"negative batch_size", 0, map[string]any{"batch_size": -4}, 0},
		{"batch_size as a string", 0, map[string]any{"batch_size": "32"}, 0},
		{"a preset's default (lm)", 0, map[string]any{"preset": "tiny"}, 0},
		{"no workload config", 0, nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Lease.SamplesPerStep = tc.field
			cfg.Workload.Config = tc.config
			require.Equal(t, tc.want, samplesPerStep(cfg))
		})
	}
}

// digitsPlan is the digits demo's plan: 23 microshards, 1438 examples.
func digitsPlan() *dataset.Plan {
	p := &dataset.Plan{}
	for i := range 23 {
		n := int64(62)
		if i < 12 {
			n = 63
		}
		p.Shards = append(p.Shards, dataset.Microshard{Index: i, Examples: n})
	}
	return p
}

// TestWindowShareLeader: the leader's share follows the rule from its config and plan, and
// a config that cannot satisfy it logs one warning naming the fields and sizes, however
// often the leader leases and however the fleet changes.
func TestWindowShareLeader(t *testing.T) {
	cases := []struct {
		name     string
		batch    int
		per      int
		trainers []int // the fleet at each grant
		want     []int
		warns    int
	}{
		{"the demo: batch 16, three trainers", 16, 6, []int{3, 3, 2}, []int{6, 6, 6}, 0},
		{"raised to a window", 16, 3, []int{3, 3}, []int{6, 6}, 0},
		{"batch 32, three trainers do not fit 23 microshards", 32, 3, []int{3, 3, 3, 2, 3}, []int{3, 3, 3, 11, 3}, 1},
		{"batch unknown", 0, 3, []int{3}, []int{3}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Protocol.InnerSteps = 20
			cfg.Lease.MicroshardsPerTrainer = tc.per
			cfg.Workload.Config = map[string]any{}
			if tc.batch > 0 {
				cfg.Workload.Config["batch_size"] = tc.batch
			}
			var logs bytes.Buffer
			v := &validator{Params: Params{Config: cfg, Plan: digitsPlan(),
				Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}}
			var got []int
			for _, n := range tc.trainers {
				got = append(got, v.windowShare(n))
			}
			require.Equal(t, tc.want, got)
			out := logs.String()
			require.Equal(t, tc.warns, strings.Count(out, "level=WARN"), out)
			if tc.warns > 0 {
				for _, s := range []string{"lease.microshards_per_trainer", "protocol.inner_steps", "lease.samples_per_step",
					"microshards_a_window_needs=11", "plan_microshards=23", "trainers=3", "samples_per_step=32"} {
					require.Contains(t, out, s)
				}
			}
		})
	}
}

// TestReferenceShareSaysNothing: the leader's sizing note is said once, however the
// reference windows (sized for one trainer) and the grants (for the fleet) alternate.
func TestReferenceShareSaysNothing(t *testing.T) {
	cfg := config.Default()
	cfg.Protocol.InnerSteps = 20
	cfg.Lease.MicroshardsPerTrainer = 3
	var logs bytes.Buffer
	v := &validator{Params: Params{Config: cfg, Plan: digitsPlan(),
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}}
	for range 3 {
		require.Equal(t, 3, v.windowShare(3))
		require.Equal(t, 3, v.referenceShare())
	}
	require.Equal(t, 1, strings.Count(logs.String(), "leases sized by lease.microshards_per_trainer alone"), logs.String())
}
