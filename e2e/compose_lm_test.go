//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestComposeLM: the lm workload at 32 M parameters (the small preset with 18 layers: 128 MB
// packs, about 640 MB of scratch space per worker) in containers whose /dev/shm is Docker's
// default 64 MiB. Every node says once, before its first round, that its scratch dir is too
// small and moves it to its store on disk; the fleet then trains: rounds close with the
// trainers' contributions merged and the held-out loss falls.
func TestComposeLM(t *testing.T) {
	f := newFleet(t, fleetOptions{
		Trainers: 3, InnerSteps: 4, RoundTimeout: 20 * time.Minute, Workload: "lm",
		WorkloadConfig: map[string]any{"preset": "small", "layers": 18, "context": 64, "batch_size": 2, "eval_bytes": 1024},
		Env:            []string{"P2PNODE_SHM_SIZE=64m"},
	})
	f.up()
	v := f.waitRound("validator", 2, 20*time.Minute)
	var first, last float64
	for _, p := range v.History {
		if l, ok := p.HeldOut["loss"]; ok {
			if first == 0 {
				first = l
			}
			last = l
		}
	}
	if first == 0 || last >= first-0.3 {
		t.Fatalf("held-out loss did not fall: %.3f -> %.3f (%+v)", first, last, v.History)
	}
	for _, svc := range fleet3 {
		logs := f.docker("logs", f.id(svc))
		if n := strings.Count(logs, "scratch dir too small for the packs"); n != 1 {
			t.Errorf("%s: %d scratch warnings, want 1:\n%s", svc, n, tail(logs, 30))
		} else {
			for _, line := range strings.Split(logs, "\n") {
				if strings.Contains(line, "scratch dir too small") {
					t.Logf("%s: %s", svc, line)
				}
			}
		}
	}
	head, round, _ := f.sameHead(fleet3, 5*time.Minute)
	t.Logf("all 4 nodes on %s at round %d; held-out loss %.3f -> %.3f", head, round, first, last)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
