package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/demo"
	"github.com/p2pnode/p2pnode/node"
)

// swarm writes the demo's configs (one validator+bootstrap, n trainers) under dir and
// returns the processes, not started.
func swarm(t *testing.T, dir string, trainers, rounds int, edit func(name string, c *config.Config)) []*Proc {
	t.Helper()
	return swarmOf(t, demo.Options{Dir: dir, Trainers: trainers, Rounds: rounds}, edit)
}

// swarmOf is swarm for any demo options (another workload, say).
func swarmOf(t *testing.T, o demo.Options, edit func(name string, c *config.Config)) []*Proc {
	t.Helper()
	dir := o.Dir
	cfgs, err := demo.WriteConfigs(o)
	if err != nil {
		t.Fatal(err)
	}
	var procs []*Proc
	for i, name := range demo.Names(o.Trainers) {
		c := cfgs[i]
		if edit != nil {
			edit(name, c)
		}
		procs = append(procs, NewProc(t, dir, name, c))
	}
	DumpOnFailure(t, procs...)
	return procs
}

// runAll starts every process and waits for each to exit cleanly within timeout.
func runAll(t *testing.T, procs []*Proc, timeout time.Duration) {
	t.Helper()
	for _, p := range procs {
		p.Start()
	}
	waitAll(t, procs, timeout)
}

// TestLoopbackSwarmTrainsDigits: 1 validator and 2 trainers, real processes over loopback
// TCP with the Python worker: held-out accuracy improves over 3 rounds and every node ends
// on the same head.
func TestLoopbackSwarmTrainsDigits(t *testing.T) {
	dir := t.TempDir()
	procs := swarm(t, dir, 2, 3, nil)
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	runAll(t, procs, 4*time.Minute)
	v := procs[0]
	acc0, ok0 := v.AccuracyAt(0)
	acc3, ok3 := v.AccuracyAt(3)
	if !ok0 || !ok3 {
		t.Fatalf("the validator printed no accuracy for round 0 or 3:\n%s", v.Output())
	}
	if acc3 <= acc0 {
		t.Fatalf("held-out accuracy did not improve: round 0 %.3f, round 3 %.3f", acc0, acc3)
	}
	tips := map[string]bool{}
	for _, p := range procs {
		tips[readTip(t, p)] = true
	}
	if len(tips) != 1 {
		t.Fatalf("nodes ended on different heads: %v", tips)
	}
	t.Logf("held-out accuracy %.3f -> %.3f", acc0, acc3)
}

// TestLoopbackSwarmTrainsLM: the lm workload's tiny preset (its batch and context cut so
// that a CPU runs a window in seconds) through 1 validator and 2 trainers, real processes
// with the Python worker: the held-out loss falls over 3 rounds and every node ends on the
// same head.
func TestLoopbackSwarmTrainsLM(t *testing.T) {
	dir := t.TempDir()
	procs := swarmOf(t, demo.Options{Dir: dir, Trainers: 2, Rounds: 3, Workload: demo.WorkloadLM}, func(_ string, c *config.Config) {
		c.Workload.Config = map[string]any{"preset": "tiny", "context": 64, "batch_size": 4, "eval_bytes": 8192, "warmup": 10}
		c.Protocol.InnerSteps = 15
	})
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	for _, p := range procs {
		p.Start()
	}
	for _, p := range procs {
		if err := p.Wait(6 * time.Minute); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
	}
	v := procs[0]
	loss0, ok0 := v.MetricAt(0, "loss")
	loss3, ok3 := v.MetricAt(3, "loss")
	if !ok0 || !ok3 {
		t.Fatalf("the validator printed no held-out loss for round 0 or 3:\n%s", v.Output())
	}
	// A uniform guess over 256 bytes is ln 256 = 5.55 nats; 45 steps of the tiny model on
	// Python sources reach about 3.
	if loss0 < 5 || loss3 > loss0-1.5 {
		t.Fatalf("held-out loss did not fall clearly: round 0 %.3f, round 3 %.3f\n%s", loss0, loss3, v.Output())
	}
	tips := map[string]bool{}
	for _, p := range procs {
		tips[readTip(t, p)] = true
	}
	if len(tips) != 1 {
		t.Fatalf("nodes ended on different heads: %v", tips)
	}
	t.Logf("held-out loss %.3f -> %.3f nats/byte\n%s", loss0, loss3, v.Output())
}

// TestLateJoinerCatchesUp starts a trainer only after the swarm has trained several rounds:
// it fetches the canonical tip and its ancestors from peers and joins the next round.
func TestLateJoinerCatchesUp(t *testing.T) {
	dir := t.TempDir()
	// Long windows keep rounds slow enough that the swarm is still training when the late
	// trainer's worker has started.
	procs := swarm(t, dir, 2, 30, func(_ string, c *config.Config) { c.Protocol.InnerSteps = 400 })
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	procs[0].Start()
	procs[1].Start()
	Eventually(t, 3*time.Minute, "round 10", func() bool {
		r := procs[0].Rounds()
		return len(r) > 0 && r[len(r)-1] >= 10
	})
	late := procs[2]
	late.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	Eventually(t, 3*time.Minute, "the late trainer to contribute", func() bool {
		st, err := late.Status(ctx)
		return err == nil && st.Last != nil && st.Last.Round > 10
	})
	// While the swarm runs: status and metrics a user would look at.
	out, err := exec.Command(mustBinary(t), "status", "--config", late.Config).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "peer        "+late.peerID(t)) || !strings.Contains(string(out), "connected") {
		t.Fatalf("p2pnode status: %v\n%s", err, out)
	}
	for name, p := range map[string]*Proc{"validator": procs[0], "trainer": late} {
		metrics := p.Metrics(t)
		for _, want := range []string{"p2ptrain_node_head_round", "p2ptrain_gossip_messages_total", "p2ptrain_artifact_fetch_duration_seconds",
			"p2ptrain_pyruntime_call_seconds", "p2ptrain_node_protocol_bytes_total"} {
			if !strings.Contains(metrics, want) {
				t.Errorf("%s /metrics lacks %s", name, want)
			}
		}
	}
	if !strings.Contains(procs[0].Metrics(t), "p2ptrain_node_rounds_closed_total") {
		t.Errorf("validator /metrics lacks p2ptrain_node_rounds_closed_total")
	}
	for _, p := range procs {
		if err := p.Wait(4 * time.Minute); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
	}
	if a, b := readTip(t, procs[0]), readTip(t, late); a != b {
		t.Fatalf("late joiner ended on %s, validator on %s", b, a)
	}
	if !strings.Contains(late.Logs(), "caught up") {
		t.Fatalf("the late joiner did not catch up through head sync")
	}
}

func readTip(t *testing.T, p *Proc) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.Cfg.Node.StoreDir, node.TipFile))
	if err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
	return strings.TrimSpace(string(b))
}
