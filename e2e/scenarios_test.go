package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/node"
)

// The process-harness versions of the docker-compose scenarios (compose_test.go, build tag
// e2e): real p2pnode processes on loopback, so they also run where no Docker engine
// answers. The partition scenario has no counterpart here: cutting one process off
// loopback needs network namespaces (root), which is what the Docker version has.

// Stop sends SIGTERM to the node, as `docker stop` does, and waits for it to exit; after
// timeout it kills the process group.
func (p *Proc) Stop(timeout time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("%s did not stop within %s of SIGTERM", p.Name, timeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

// lastRound is the last round a process printed (-1 before any).
func lastRound(p *Proc) int {
	r := p.Rounds()
	if len(r) == 0 {
		return -1
	}
	return r[len(r)-1]
}

func waitRound(t *testing.T, p *Proc, round int, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, fmt.Sprintf("%s to print round %d", p.Name, round), func() bool { return lastRound(p) >= round })
}

func statusOf(p *Proc) *node.Status {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := p.Status(ctx)
	if err != nil {
		return nil
	}
	return s
}

// sameTips checks that every process ended on the same head and returns it.
func sameTips(t *testing.T, procs []*Proc) string {
	t.Helper()
	tips := map[string][]string{}
	for _, p := range procs {
		tip := readTip(t, p)
		tips[tip] = append(tips[tip], p.Name)
	}
	if len(tips) != 1 {
		t.Fatalf("nodes ended on different heads: %v", tips)
	}
	for tip := range tips {
		return tip
	}
	return ""
}

// startSwarm starts the validator, waits until it serves /status (its libp2p host listens
// by then), then starts the trainers: a trainer that dials too early is held back by
// libp2p's dial backoff for seconds, longer than a few rounds on digits.
func startSwarm(t *testing.T, procs []*Proc) {
	t.Helper()
	procs[0].Start()
	Eventually(t, time.Minute, "the validator's status", func() bool { return statusOf(procs[0]) != nil })
	for _, p := range procs[1:] {
		p.Start()
	}
}

func waitAll(t *testing.T, procs []*Proc, timeout time.Duration) {
	t.Helper()
	for _, p := range procs {
		if err := p.Wait(timeout); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
	}
}

// TestSwarmTrainerCrashCatchesUp kills a trainer (SIGKILL, with its worker) while it holds
// a lease: the round closes at its deadline without it, rounds keep closing, and the
// restarted trainer catches up to the canonical head and contributes again.
func TestSwarmTrainerCrashCatchesUp(t *testing.T) {
	dir := t.TempDir()
	procs := swarm(t, dir, 3, 20, func(_ string, c *config.Config) {
		c.Protocol.InnerSteps = 400
		c.Lease.RoundTimeout = 10 * time.Second
	})
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	startSwarm(t, procs)
	v, victim := procs[0], procs[2]
	waitRound(t, v, 2, 2*time.Minute)
	Eventually(t, time.Minute, "trainer-2 to hold a lease", func() bool {
		s := statusOf(victim)
		return s != nil && len(s.Leases) > 0
	})
	victim.Kill()
	killed := lastRound(v)
	waitRound(t, v, killed+2, time.Minute)
	t.Logf("killed trainer-2 mid-window after round %d; the swarm closed round %d without it", killed, lastRound(v))

	restarted := NewProc(t, dir, victim.Name, victim.Cfg)
	DumpOnFailure(t, restarted)
	restarted.Start()
	Eventually(t, 2*time.Minute, "the restarted trainer to contribute", func() bool {
		s := statusOf(restarted)
		return s != nil && s.Last != nil && s.Last.Round > uint64(killed+2)
	})
	t.Logf("restarted trainer-2 contributed to round %d", statusOf(restarted).Last.Round)
	procs[2] = restarted
	waitAll(t, procs, 3*time.Minute)
	sameTips(t, procs)
}

// TestSwarmValidatorRestart stops the validator (SIGTERM) mid-run and starts it again: it
// resumes from its store at the head and round it stopped at, never earlier, the chain
// continues from that head, and the trainers follow it to the end.
func TestSwarmValidatorRestart(t *testing.T) {
	dir := t.TempDir()
	procs := swarm(t, dir, 2, 12, func(_ string, c *config.Config) { c.Protocol.InnerSteps = 400 })
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	startSwarm(t, procs)
	v := procs[0]
	waitRound(t, v, 3, 2*time.Minute)
	if err := v.Stop(30 * time.Second); err != nil {
		t.Fatalf("stop the validator: %v", err)
	}
	stoppedAt, tip := lastRound(v), readTip(t, v)
	t.Logf("validator stopped after round %d at %s", stoppedAt, tip)

	v2 := NewProc(t, dir, v.Name, v.Cfg)
	DumpOnFailure(t, v2)
	v2.Start()
	var first *node.Status
	Eventually(t, time.Minute, "the restarted validator's status", func() bool {
		first = statusOf(v2)
		return first != nil && first.Head != ""
	})
	if int(first.Round) < stoppedAt || (int(first.Round) == stoppedAt && first.Head != tip) {
		t.Fatalf("restarted validator reports round %d head %s; it stopped at round %d head %s", first.Round, first.Head, stoppedAt, tip)
	}
	procs[0] = v2
	waitAll(t, procs, 3*time.Minute)
	if rounds := v2.Rounds(); len(rounds) == 0 || rounds[0] < stoppedAt || rounds[len(rounds)-1] != 12 {
		t.Fatalf("rounds printed after the restart: %v (stopped at %d)", rounds, stoppedAt)
	}
	final := sameTips(t, procs)

	st, err := node.OpenStores(v2.Cfg)
	if err != nil {
		t.Fatal(err)
	}
	ids, _, err := st.Heads.Chain(cid.MustParse(final))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ids, func(id cid.Cid) bool { return id.String() == tip }) {
		t.Fatalf("the final chain does not pass through %s, where the validator stopped", tip)
	}
	if out, err := exec.Command(mustBinary(t), "audit", "--config", v2.Config).CombinedOutput(); err != nil {
		t.Fatalf("audit after the restart: %v\n%s", err, out)
	}
}

// TestSwarmScale runs 8 trainers and a validator (9 processes, 9 Python workers) for 5
// rounds: every node ends on the same head.
func TestSwarmScale(t *testing.T) {
	// The first round waits for all eight trainers: on digits the five rounds take about a
	// second, less than a worker takes to start.
	procs := swarm(t, t.TempDir(), 8, 5, func(_ string, c *config.Config) { c.Lease.MinGroup = 8 })
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	start := time.Now()
	startSwarm(t, procs)
	waitAll(t, procs, 4*time.Minute)
	if r := lastRound(procs[0]); r != 5 {
		t.Fatalf("the validator's last round is %d, want 5", r)
	}
	tip := sameTips(t, procs)
	t.Logf("9 nodes ended on %s after 5 rounds in %s", tip, time.Since(start).Round(time.Second))
}
