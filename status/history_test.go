package status

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLoadHistory(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		rounds     []uint64
	}{
		{"missing", "", nil},
		{"in order", `{"round":0}` + "\n" + `{"round":1}` + "\n", []uint64{0, 1}},
		{"torn last line", `{"round":0}` + "\n" + `{"round":1}` + "\n" + `{"rou`, []uint64{0, 1}},
		{"a round followed again keeps the newest", `{"round":0}` + "\n" + `{"round":1,"merged":1}` + "\n" + `{"round":1,"merged":2}` + "\n", []uint64{0, 1}},
		{"resumed from an older tip", `{"round":0}` + "\n" + `{"round":1}` + "\n" + `{"round":2}` + "\n" + `{"round":1}` + "\n", []uint64{0, 1}},
		{"garbage line skipped", `{"round":0}` + "\nnot json\n" + `{"round":1}` + "\n", []uint64{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.file != "" {
				require.NoError(t, os.WriteFile(filepath.Join(dir, HistoryFile), []byte(tc.file), 0o644))
			}
			var got []uint64
			for _, p := range LoadHistory(dir) {
				got = append(got, p.Round)
			}
			require.Equal(t, tc.rounds, got)
		})
	}
	dir := t.TempDir()
	for r := range uint64(3) {
		require.NoError(t, AppendHistory(dir, RoundPoint{Round: r, HeldOut: map[string]float64{"loss": 1 / float64(r+1)}}))
	}
	h := LoadHistory(dir)
	require.Len(t, h, 3)
	require.Equal(t, 0.5, h[1].HeldOut["loss"])
}

func FuzzLoadHistory(f *testing.F) {
	f.Add([]byte(`{"round":0}` + "\n" + `{"round":1,"held_out":{"loss":0.5}}` + "\n"))
	f.Add([]byte("\n\n{"))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, HistoryFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		h := LoadHistory(dir)
		require.LessOrEqual(t, len(h), MaxHistory)
		for i := 1; i < len(h); i++ {
			require.Less(t, h[i-1].Round, h[i].Round, "rounds must ascend")
		}
	})
}
