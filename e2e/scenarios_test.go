package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/node"
	"github.com/p2pnode/p2pnode/status"
)

// The process-harness versions of the docker-compose scenarios (compose_test.go, build tag
// e2e): real p2pnode processes on loopback, so they also run where no Docker engine
// answers. Cutting one process off loopback would need network namespaces (root), so the
// partition scenario freezes the trainer (SIGSTOP on its process group) instead: to the
// swarm it is a peer that went silent for two rounds; the Docker version disconnects it.

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

// Signal sends sig to the node's process group (the node and its Python worker).
func (p *Proc) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return fmt.Errorf("%s is not running", p.Name)
	}
	return syscall.Kill(-cmd.Process.Pid, sig)
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

func statusOf(p *Proc) *status.Status {
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

// runningSwarm starts a validator and trainers that train 400 inner steps per round with
// a 10 s round timeout, and returns once the validator has closed round 2.
func runningSwarm(t *testing.T, dir string, trainers, rounds int) []*Proc {
	t.Helper()
	procs := swarm(t, dir, trainers, rounds, func(_ string, c *config.Config) {
		c.Protocol.InnerSteps = 400
		c.Lease.RoundTimeout = 10 * time.Second
	})
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	startSwarm(t, procs)
	waitRound(t, procs[0], 2, 2*time.Minute)
	return procs
}

// waitContribution waits until p's last contribution is to a round after round.
func waitContribution(t *testing.T, p *Proc, round int) {
	t.Helper()
	Eventually(t, 2*time.Minute, fmt.Sprintf("%s to contribute after round %d", p.Name, round), func() bool {
		s := statusOf(p)
		return s != nil && s.Last != nil && s.Last.Round > uint64(round)
	})
}

// TestSwarmTrainerCrashCatchesUp kills a trainer (SIGKILL, with its worker) while it holds
// a lease: the round closes at its deadline without it, rounds keep closing, and the
// restarted trainer catches up to the canonical head and contributes again.
func TestSwarmTrainerCrashCatchesUp(t *testing.T) {
	dir := t.TempDir()
	procs := runningSwarm(t, dir, 3, 20)
	v, victim := procs[0], procs[2]
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
	waitContribution(t, restarted, killed+2)
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
	var first *status.Status
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

// TestSwarmFrozenTrainerCatchesUp freezes a trainer for two rounds (the process version of
// the partition scenario) and lets it go: it catches up to the canonical head and
// contributes again, and the audit finds no microshard lost or trained twice.
func TestSwarmFrozenTrainerCatchesUp(t *testing.T) {
	dir := t.TempDir()
	procs := runningSwarm(t, dir, 3, 16)
	v, frozen := procs[0], procs[3]
	if err := frozen.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cut := lastRound(v)
	waitRound(t, v, cut+2, time.Minute)
	if s := statusOf(v); s != nil && len(frozen.Rounds()) > 0 && lastRound(frozen) >= int(s.Round) {
		t.Fatalf("the frozen trainer printed round %d, the validator is at %d", lastRound(frozen), s.Round)
	}
	if err := frozen.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("trainer-3 frozen from round %d to %d", cut, lastRound(v))
	waitContribution(t, frozen, cut+2)
	waitAll(t, procs, 3*time.Minute)
	tip := sameTips(t, procs)
	out, err := exec.Command(mustBinary(t), "audit", "--config", v.Config).CombinedOutput()
	if err != nil {
		t.Fatalf("audit after the freeze: %v\n%s", err, out)
	}
	t.Logf("all on %s; audit:\n%s", tip, out)
}

// TestSwarmPoisonedTrainerIsQuarantined adds a trainer that sends its update scaled by
// 1000 (`p2pnode run --poison scale`) to a training swarm: none of its contributions is
// merged, the validator quarantines it, and the honest swarm still reaches 90 %.
func TestSwarmPoisonedTrainerIsQuarantined(t *testing.T) {
	dir := t.TempDir()
	procs := swarm(t, dir, 4, 40, func(_ string, c *config.Config) {
		c.Protocol.InnerSteps = 400
		c.Lease.RoundTimeout = 10 * time.Second
		// Screening compares updates only in a cohort of three or more: min_group 3, and
		// max_norm for rounds at the end of an epoch, which may have microshards for only
		// two trainers (honest updates here are below 3).
		c.Lease.MinGroup = 3
		c.Merge.Screen.MaxNorm = 100
	})
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	attacker := procs[4]
	attacker.Args = []string{"--poison", "scale"}
	// The honest swarm first.
	startSwarm(t, procs[:4])
	v := procs[0]
	waitRound(t, v, 2, 2*time.Minute)
	attacker.Start()
	Eventually(t, time.Minute, "the attacker's peer id", func() bool { return strings.HasPrefix(attacker.Output(), "p2pnode ") })
	id := attacker.peerID(t)
	Eventually(t, 2*time.Minute, "the attacker to be quarantined", func() bool {
		s := statusOf(v)
		if s == nil || s.Validator == nil {
			return false
		}
		_, ok := s.Validator.Quarantined[id]
		return ok
	})
	t.Logf("attacker quarantined at round %d", lastRound(v))
	waitAll(t, procs, 3*time.Minute)
	tip := sameTips(t, procs[:4])
	st, err := node.OpenStores(v.Cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, heads, err := st.Heads.Chain(cid.MustParse(tip))
	if err != nil {
		t.Fatal(err)
	}
	honest := 0
	for _, h := range heads {
		for _, c := range h.Contributions {
			if c.Peer == id {
				t.Errorf("round %d merged a contribution of the attacker", h.Round)
			} else {
				honest++
			}
		}
	}
	// The best of the last five rounds: held-out accuracy on digits swings by several
	// points from round to round once the model has converged.
	best := 0.0
	for r := 36; r <= 40; r++ {
		if a, ok := v.AccuracyAt(r); ok {
			best = max(best, a)
		}
	}
	if best < 0.90 {
		t.Fatalf("best held-out accuracy of rounds 36-40 is %.3f, want >= 0.90", best)
	}
	t.Logf("%d heads merging %d honest contributions, best accuracy of the last 5 rounds %.3f", len(heads), honest, best)
}
