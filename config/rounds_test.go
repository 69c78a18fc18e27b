package config

import "testing"

func TestRoundLimitReached(t *testing.T) {
	tests := []struct {
		rounds int
		round  uint64
		want   bool
	}{
		{0, 0, false}, // no limit
		{0, 1 << 40, false},
		{3, 0, false},
		{3, 2, false},
		{3, 3, true},
		{3, 4, true},
		{1, 1, true},
	}
	for _, tt := range tests {
		if got := RoundLimitReached(tt.rounds, tt.round); got != tt.want {
			t.Errorf("RoundLimitReached(%d, %d) = %v, want %v", tt.rounds, tt.round, got, tt.want)
		}
		if got := (Experiment{Rounds: tt.rounds}).RoundLimitReached(tt.round); got != tt.want {
			t.Errorf("Experiment{Rounds: %d}.RoundLimitReached(%d) = %v, want %v", tt.rounds, tt.round, got, tt.want)
		}
	}
}
