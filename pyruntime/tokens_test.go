package pyruntime

import "testing"

// The worker reports how many tokens a sample trains on: a language model's context; a
// workload that counts no tokens, none.
func TestWorkerReportsTokensPerSample(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		factory string
		config  map[string]any
		want    int64
	}{
		{"digits", digitsFactory, nil, 0},
		{"lm", "p2ptrain.workloads.lm:LM", map[string]any{"preset": "tiny", "layers": 1, "width": 32, "heads": 2, "context": 48}, 48},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, _ := baseOptions(t, tc.factory, tc.config)
			w, info := startWorker(t, opts)
			if info.TokensPerSample != tc.want {
				t.Fatalf("hello: tokens_per_sample %d, want %d", info.TokensPerSample, tc.want)
			}
			if got := w.Status().TokensPerSample; got != tc.want {
				t.Fatalf("status: tokens_per_sample %d, want %d", got, tc.want)
			}
		})
	}
}
