package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseCount(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "1M", want: 1e6}, {in: "10m", want: 1e7}, {in: "1B", want: 1e9}, {in: "250K", want: 250e3},
		{in: "1.5M", want: 1.5e6}, {in: "2000000", want: 2e6},
		{in: "100", bad: true}, {in: "x", bad: true}, {in: "-1M", bad: true},
	} {
		got, err := parseCount(tc.in)
		if tc.bad {
			require.Error(t, err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
	for n, want := range map[int64]string{1e6: "1M", 1e9: "1B", 1.5e6: "1500K", 1234567: "1234567"} {
		require.Equal(t, want, countName(n))
	}
}

// A 1 B-parameter row of 16 trainers needs hundreds of GB of disk (4 GB a pack): the
// estimate must say so rather than let the row start.
func TestEstimateGrowsWithTrainersAndRounds(t *testing.T) {
	var e estimator
	small := e.need(1e6, 3, 2, 1)
	big := e.need(1e9, 16, 2, 1)
	require.Greater(t, big.disk, int64(200e9))
	require.Less(t, small.disk, int64(2e9))
	require.Greater(t, e.need(1e9, 16, 2, 2).disk, big.disk)
	e.learn(&rowResult{params: 100e6, rss: roleRSS{leaderAnon: 5}})
	require.Greater(t, e.need(1e9, 16, 2, 1).ram, big.ram)
}
