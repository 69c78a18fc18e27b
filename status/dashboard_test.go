package status

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// dashboardBoard is a board with the rounds of a language model: held-out bits per byte,
// the leader's round time (rounds 1 and 2), this node's time and bytes (rounds 2 and 3).
func dashboardBoard(tokensPerSample int64) *Board {
	b := NewBoard(Status{Peer: "me", Network: "n", Experiment: "lm", Roles: []string{"trainer"}, History: []RoundPoint{
		{Round: 0, Head: "h0", HeldOut: map[string]float64{"loss": 5.5, "bits_per_byte": 7.9}},
		{Round: 1, Head: "h1", TrainLoss: 4, Samples: 64, Merged: 2, Time: &RoundTime{Seconds: 8}},
		{Round: 2, Head: "h2", TrainLoss: 3, Samples: 96, Merged: 3, Time: &RoundTime{Seconds: 4}, Seconds: 5, BytesIn: 4 << 20, BytesOut: 1 << 20,
			HeldOut: map[string]float64{"loss": 2.1, "bits_per_byte": 3.03}},
		{Round: 3, Head: "h3", TrainLoss: 2.5, Samples: 50, Merged: 1, Seconds: 10, BytesIn: 2 << 20, BytesOut: 512 << 10},
	}})
	if tokensPerSample > 0 {
		b.TokensPerSample = func() int64 { return tokensPerSample }
	}
	return b
}

// getStatus is /status as the page fetches it, decoded as the page sees it.
func getStatus(t *testing.T, b *Board) map[string]any {
	t.Helper()
	h := NewHTTPServer("127.0.0.1:0", "", b, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	rec := httptest.NewRecorder()
	h.srv.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/status", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	var s map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &s))
	return s
}

func TestStatusJSONHasWhatTheDashboardCharts(t *testing.T) {
	for _, tc := range []struct {
		name            string
		tokensPerSample int64
		samples, tokens []any // per round; nil: the key is absent
	}{
		{"samples only", 0, []any{nil, 8.0, 24.0, 5.0}, []any{nil, nil, nil, nil}},
		{"a language model", 128, []any{nil, 8.0, 24.0, 5.0}, []any{nil, 1024.0, 3072.0, 640.0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := getStatus(t, dashboardBoard(tc.tokensPerSample))
			if tc.tokensPerSample > 0 {
				require.Equal(t, float64(tc.tokensPerSample), s["tokens_per_sample"])
			} else {
				require.NotContains(t, s, "tokens_per_sample")
			}
			h := s["history"].([]any)
			require.Len(t, h, 4)
			for i, raw := range h {
				p := raw.(map[string]any)
				require.Equal(t, tc.samples[i], p["samples_per_second"], "round %d samples/s: the leader's round time, else this node's", i)
				require.Equal(t, tc.tokens[i], p["tokens_per_second"], "round %d tokens/s", i)
			}
			// Bytes on the wire, and bits per byte, as the page reads them.
			p2 := h[2].(map[string]any)
			require.Equal(t, float64(4<<20), p2["bytes_in"])
			require.Equal(t, float64(1<<20), p2["bytes_out"])
			require.Equal(t, 3.03, p2["held_out"].(map[string]any)["bits_per_byte"])
		})
	}
}

// The page reads the keys /status has: a renamed field would leave a chart empty.
func TestDashboardReadsTheStatusKeys(t *testing.T) {
	page := string(dashboardHTML)
	for _, key := range []string{"samples_per_second", "tokens_per_second", "tokens_per_sample", "bytes_in", "bytes_out",
		"bits_per_byte", "train_loss", "held_out", "history"} {
		require.Contains(t, page, key)
	}
	for _, id := range []string{`id="logloss"`, `id="bpb"`, `id="rate"`, `id="wire"`} {
		require.Contains(t, page, id)
	}
	require.True(t, strings.Contains(page, "chart('loss'") && strings.Contains(page, "logLoss);"), "the loss chart follows the log-scale toggle")
}

// Rates are worked out for /status only: the history file keeps what was measured.
func TestRatesAreNotKeptInTheHistoryFile(t *testing.T) {
	dir := t.TempDir()
	b := dashboardBoard(128)
	for _, p := range b.Snapshot().History {
		require.NoError(t, AppendHistory(dir, p))
	}
	raw, err := os.ReadFile(filepath.Join(dir, HistoryFile))
	require.NoError(t, err)
	require.NotContains(t, string(raw), "per_second")
	require.Len(t, LoadHistory(dir), 4)
}
