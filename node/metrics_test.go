package node

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/pyruntime"
	"github.com/p2pnode/p2pnode/status"
	"github.com/p2pnode/p2pnode/synth"
	"github.com/p2pnode/p2pnode/validator"
)

// lossAccuracyRuntime is the synthetic runtime reporting its held-out error under the keys
// the shipped Python workloads use (loss, accuracy), as the dashboard expects.
type lossAccuracyRuntime struct{ *synth.Runtime }

func (r lossAccuracyRuntime) Evaluate(ctx context.Context, path string) (map[string]float64, error) {
	m, err := r.Runtime.Evaluate(ctx, path)
	if err != nil {
		return nil, err
	}
	return map[string]float64{"loss": m["mse"], "accuracy": 1 / (1 + m["rmse"])}, nil
}

var _ pyruntime.Runtime = lossAccuracyRuntime{}

// exportedFamilies runs a solo node for two rounds and returns the metric families its
// registry (the one /metrics serves) exports, by name.
func exportedFamilies(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	dir := t.TempDir()
	synthDataset(t, filepath.Join(dir, "data"), 4)
	cfg := soloConfig(t, dir, 2)
	n, err := New(cfg, Options{Progress: &syncBuffer{}, Runtime: lossAccuracyRuntime{synth.New(t.TempDir())}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, n.Run(ctx))
	mfs, err := n.reg.Gather()
	require.NoError(t, err)
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

func TestNodeMetricsFollowConventionsAndAreDocumented(t *testing.T) {
	fams := exportedFamilies(t)
	doc, err := os.ReadFile("../docs/metrics.md")
	require.NoError(t, err)
	for _, name := range []string{
		"p2ptrain_build_info", "go_goroutines", "process_cpu_seconds_total", "p2ptrain_node_peers",
		"p2ptrain_node_head_heldout_loss", "p2ptrain_node_head_heldout_accuracy", "p2ptrain_node_head_train_loss",
		"p2ptrain_node_train_loss", "p2ptrain_node_train_seconds_total", "p2ptrain_pyruntime_restarts_total",
		"p2ptrain_node_round_duration_seconds", "p2ptrain_node_round_phase_seconds", "p2ptrain_node_contributions_merged_total",
	} {
		require.Contains(t, fams, name)
	}
	require.Equal(t, 2.0, fams["p2ptrain_node_rounds_closed_total"].GetMetric()[0].GetCounter().GetValue())
	phases := map[string]*dto.Histogram{}
	for _, m := range fams["p2ptrain_node_round_phase_seconds"].GetMetric() {
		phases[m.GetLabel()[0].GetValue()] = m.GetHistogram()
	}
	for _, phase := range status.RoundPhases {
		require.Equal(t, uint64(2), phases[phase].GetSampleCount(), "phase %s observed once per round led", phase)
	}
	require.Positive(t, phases["training"].GetSampleSum())
	for name, mf := range fams {
		if !strings.HasPrefix(name, "p2ptrain_") {
			continue
		}
		if mf.GetType() == dto.MetricType_COUNTER {
			require.True(t, strings.HasSuffix(name, "_total"), "counter %s must end in _total", name)
		} else {
			require.False(t, strings.HasSuffix(name, "_total"), "%s is a %s, not a counter, yet ends in _total", name, mf.GetType())
		}
		documented := name
		if strings.HasPrefix(name, status.HeldOutPrefix) {
			documented = status.HeldOutPrefix + "<name>"
		}
		require.Contains(t, string(doc), "`"+documented+"`", "docs/metrics.md must list %s", name)
	}
	// Every labelled counter of the node starts at 0 for each reason it can give.
	var reasons []string
	for _, m := range fams["p2ptrain_node_contributions_rejected_total"].GetMetric() {
		reasons = append(reasons, m.GetLabel()[0].GetValue())
	}
	for _, r := range validator.RejectReasons {
		require.Contains(t, reasons, r)
	}
}

func TestGrafanaDashboardQueriesNameExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("../docs/grafana/p2pnode.json")
	require.NoError(t, err)
	var dash any
	require.NoError(t, json.Unmarshal(raw, &dash))
	queries := dashboardQueries(dash)
	require.GreaterOrEqual(t, len(queries), 20, "the dashboard's queries were not found")

	fams := exportedFamilies(t)
	var missing []string
	for _, q := range queries {
		names := promqlMetricNames(q)
		require.NotEmpty(t, names, "no metric name in query %q", q)
		for _, name := range names {
			if !exportsSeries(fams, name) {
				missing = append(missing, name+" (in "+q+")")
			}
		}
	}
	require.Empty(t, missing, "queries name metrics the node does not export")
}

// exportsSeries reports whether a query's series name is exported: a family, or a
// histogram's _bucket/_sum/_count series.
func exportsSeries(fams map[string]*dto.MetricFamily, name string) bool {
	if _, ok := fams[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if mf, ok := fams[base]; ok && (mf.GetType() == dto.MetricType_HISTOGRAM || suffix != "_bucket" && mf.GetType() == dto.MetricType_SUMMARY) {
				return true
			}
		}
	}
	return false
}

// dashboardQueries collects every target "expr" and every templating query of a Grafana
// dashboard, rows and nested panels included.
func dashboardQueries(v any) []string {
	var out []string
	var walk func(v any, key string)
	walk = func(v any, key string) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				walk(c, k)
			}
		case []any:
			for _, c := range v {
				walk(c, key)
			}
		case string:
			if key == "expr" || key == "definition" {
				out = append(out, v)
			}
		}
	}
	walk(v, "")
	sort.Strings(out)
	return slices.Compact(out)
}

var (
	promqlStrings   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlMatchers  = regexp.MustCompile(`\{[^}]*\}`)
	promqlRanges    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlVariables = regexp.MustCompile(`\$\{?\w+\}?`)
	promqlGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlLabelVals = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,[^)]*\)`)
	promqlIdent     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promqlKeywords  = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true}
)

// promqlMetricNames returns the metric names a PromQL expression (or a Grafana
// label_values(...) query) selects: identifiers that are not functions, keywords, label
// names or numbers.
func promqlMetricNames(q string) []string {
	q = promqlLabelVals.ReplaceAllString(q, "$1")
	q = promqlStrings.ReplaceAllString(q, "")
	q = promqlMatchers.ReplaceAllString(q, " ")
	q = promqlRanges.ReplaceAllString(q, " ")
	q = promqlVariables.ReplaceAllString(q, " ")
	q = promqlGrouping.ReplaceAllString(q, " ")
	var out []string
	for _, m := range promqlIdent.FindAllStringSubmatchIndex(q, -1) {
		if m[2] >= 0 {
			continue // a function call
		}
		id := q[m[0]:m[1]]
		if m[0] > 0 && (q[m[0]-1] >= '0' && q[m[0]-1] <= '9' || q[m[0]-1] == '.') {
			continue // the exponent or tail of a number (1e3)
		}
		if !promqlKeywords[strings.ToLower(id)] {
			out = append(out, id)
		}
	}
	return out
}

func TestPromQLMetricNames(t *testing.T) {
	for _, tt := range []struct {
		q    string
		want []string
	}{
		{`p2ptrain_node_peers{instance=~"$instance"}`, []string{"p2ptrain_node_peers"}},
		{`60 * sum(rate(a_total{x="y"}[$__rate_interval]))`, []string{"a_total"}},
		{`histogram_quantile(0.9, sum by (le, method) (rate(b_bucket[5m])))`, []string{"b_bucket"}},
		{`sum(rate(c_sum[1m])) / sum(rate(c_count[1m])) > bool 1e3`, []string{"c_sum", "c_count"}},
		{`label_values(p2ptrain_build_info, instance)`, []string{"p2ptrain_build_info"}},
		{`x and on(instance) y offset 5m`, []string{"x", "y"}},
		{`sum without (reason) (z)`, []string{"z"}},
	} {
		require.Equal(t, tt.want, promqlMetricNames(tt.q), tt.q)
	}
}
