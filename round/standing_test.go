package round

import "testing"

func TestStanding(t *testing.T) {
	for _, tc := range []struct {
		name            string
		merges          map[string]int
		peer            string
		probation, sole bool
	}{
		{"new peer", map[string]int{"a": TrustMerges}, "b", true, false},
		{"one short of trust", map[string]int{"a": TrustMerges - 1, "b": 1}, "a", true, false},
		{"trusted", map[string]int{"a": TrustMerges, "b": 1}, "a", false, false},
		{"the only peer merged, young", map[string]int{"a": 1}, "a", true, true},
		{"the only peer merged, trusted", map[string]int{"a": TrustMerges + 3}, "a", false, true},
		{"nothing merged yet", map[string]int{}, "a", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := OnProbation(tc.merges, tc.peer); got != tc.probation {
				t.Errorf("OnProbation(%v, %q) = %v, want %v", tc.merges, tc.peer, got, tc.probation)
			}
			if got := Sole(tc.merges, tc.peer); got != tc.sole {
				t.Errorf("Sole(%v, %q) = %v, want %v", tc.merges, tc.peer, got, tc.sole)
			}
		})
	}
}
