package e2e

import (
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/internal/testenv"
)

// requirePython skips when the interpreter cannot import torch (run `make setup`).
func requirePython(t *testing.T, interp string) {
	t.Helper()
	if err := exec.Command(interp, "-c", "import torch, numpy, sklearn").Run(); err != nil {
		testenv.Missing(t, "%s cannot import torch, numpy and sklearn (run `make setup`): %v", interp, err)
	}
}

// digitsConfig is configs/digits-local.yaml with its paths moved under dir.
func digitsConfig(t *testing.T, dir string, rounds int) *config.Config {
	t.Helper()
	cfg, err := config.Load(filepath.Join(RepoRoot(), "configs", "digits-local.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Node.StoreDir = filepath.Join(dir, "store")
	cfg.Dataset.Root = filepath.Join(dir, "data")
	cfg.Dataset.Manifest = filepath.Join(dir, "data", "manifest.json")
	cfg.Experiment.Rounds = rounds
	return cfg
}

// TestKilledNodeResumesAtTheLastRound kills a training node with SIGKILL at random moments
// and checks that each restart continues from the last round it printed, and that the
// finished run reaches the accuracy target with an intact ledger.
func TestKilledNodeResumesAtTheLastRound(t *testing.T) {
	cfg := digitsConfig(t, t.TempDir(), 40)
	requirePython(t, cfg.Workload.Interpreter)
	dir := filepath.Dir(cfg.Node.StoreDir)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	p := NewProc(t, dir, "solo", cfg)
	DumpOnFailure(t, p)
	last := -1
	for kill := 0; kill < 3; kill++ {
		p.Start()
		Eventually(t, 3*time.Minute, "a new round", func() bool {
			r := p.Rounds()
			return len(r) > 0 && r[len(r)-1] > last+1
		})
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
		p.Kill()
		rounds := p.Rounds()
		if first := rounds[0]; kill > 0 && first < last {
			t.Fatalf("restart %d began at round %d, but round %d was printed before the kill", kill, first, last)
		}
		last = rounds[len(rounds)-1]
		t.Logf("kill %d after round %d", kill+1, last)
		p = NewProc(t, dir, "solo", cfg)
		DumpOnFailure(t, p)
	}
	p.Start()
	if err := p.Wait(5 * time.Minute); err != nil {
		t.Fatalf("final run: %v", err)
	}
	rounds := p.Rounds()
	if rounds[0] < last {
		t.Fatalf("final run began at round %d, but round %d was printed before the kill", rounds[0], last)
	}
	if rounds[len(rounds)-1] != 40 || !slices.IsSorted(rounds) {
		t.Fatalf("rounds printed by the final run: %v", rounds)
	}
	acc, ok := p.LastAccuracy()
	if !ok || acc < 0.90 {
		t.Fatalf("final held-out accuracy %.3f, want >= 0.90", acc)
	}
	out, err := exec.Command(mustBinary(t), "audit", "--config", p.Config).CombinedOutput()
	if err != nil {
		t.Fatalf("audit after kills: %v\n%s", err, out)
	}
}

func mustBinary(t *testing.T) string {
	b, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
