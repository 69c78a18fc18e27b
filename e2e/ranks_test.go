package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/demo"
	"github.com/p2pnode/p2pnode/lease"
)

// ranksSwarm is the lm workload's tiny preset, cut so that a CPU step takes milliseconds
// and paced to stepSeconds a step (p2ptrain.testing:PacedLM: every rank as fast as every
// other, as equal GPUs would be, whatever else this shared machine runs), through a
// validator and three trainers: trainer-1 with two ranks on the CPU (gloo), the others with
// one. Real processes, one torch thread a rank, speed-proportional leases.
func ranksSwarm(t *testing.T, dir string, rounds, innerSteps int, stepSeconds float64) []*Proc {
	t.Helper()
	procs := swarmOf(t, demo.Options{Dir: dir, Trainers: 3, Rounds: rounds, Workload: demo.WorkloadLM}, func(name string, c *config.Config) {
		// Shard files of 16 KiB: about 115 microshards, so that the rounds stay in one
		// epoch and no lease is cut short by its tail.
		c.Workload.Factory = "p2ptrain.testing:PacedLM"
		c.Workload.Config = map[string]any{"preset": "tiny", "context": 64, "batch_size": 4, "eval_bytes": 4096, "warmup": 10,
			"shard_bytes": 16384, "step_seconds": stepSeconds}
		c.Workload.Threads = 1
		c.Dataset.MicroshardBytes = 16384
		c.Lease.MicroshardsPerTrainer = 4
		c.Lease.SamplesPerStep = 4
		c.Protocol.InnerSteps = innerSteps
		c.Protocol.SpeedProportional = true
		// A lease must outlast a restart of the 2-rank worker's ranks (two processes that
		// import torch and build the model: 10-15 s on these loaded machines), or a window
		// after a failed one expires while its ranks start (docs/gpu.md).
		c.Lease.MinDeadline = time.Minute
		if name == "trainer-1" {
			c.Workload.Device = "cpu"
			c.Workload.Ranks = 2
		}
	})
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	return procs
}

// audit runs `p2pnode audit` on a node's store and returns its report (it exits non-zero
// on any microshard lost or merged twice).
func audit(t *testing.T, p *Proc) lease.Report {
	t.Helper()
	out, err := exec.Command(mustBinary(t), "audit", "--config", p.Config).Output()
	if err != nil {
		t.Fatalf("audit: %v\n%s", err, out)
	}
	var rep lease.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("audit report: %v\n%s", err, out)
	}
	if rep.Lost != 0 || rep.Duplicated != 0 {
		t.Fatalf("audit: %d lost, %d duplicated", rep.Lost, rep.Duplicated)
	}
	return rep
}

// mergedBy counts, from the validator's head chain, the microshards and samples merged
// from each trainer in the heads of rounds from on.
func mergedBy(t *testing.T, v *Proc, from uint64) (microshards, samples map[string]int) {
	t.Helper()
	microshards, samples = map[string]int{}, map[string]int{}
	for _, h := range v.HeadChain(t) {
		if h.Round < from {
			continue
		}
		for _, c := range h.Contributions {
			microshards[c.Peer] += len(c.Microshards)
			samples[c.Peer] += int(c.Samples)
		}
	}
	return microshards, samples
}

// TestTwoRankTrainerInASwarm: a swarm of one 2-rank trainer and two 1-rank trainers
// converges, and with speed-proportional leases the 2-rank trainer, whose ranks run as fast
// as the others' (each paced to one speed), is leased about twice the microshards of each
// 1-rank trainer, and trains as many steps as they do.
func TestTwoRankTrainerInASwarm(t *testing.T) {
	const rounds = 8
	procs := ranksSwarm(t, t.TempDir(), rounds, 20, 0.25)
	startSwarm(t, procs)
	waitAll(t, procs, 8*time.Minute)
	v := procs[0]
	loss0, ok0 := v.MetricAt(0, "loss")
	lossN, okN := v.MetricAt(rounds, "loss")
	if !ok0 || !okN || lossN > loss0-1 {
		t.Fatalf("held-out loss did not fall clearly: round 0 %.3f, round %d %.3f\n%s", loss0, rounds, lossN, v.Output())
	}
	rep := audit(t, v)
	// From round 3 on, every trainer's speed is measured (round 1 leases alike, before any
	// window), and leases follow it.
	got, samples := mergedBy(t, v, 3)
	two, twoSamples := got[procs[1].peerID(t)], samples[procs[1].peerID(t)]
	t.Logf("held-out loss %.3f -> %.3f; merged in rounds 3-%d: 2-rank trainer %d microshards (%d samples), 1-rank trainers %d and %d (%d and %d samples); audit %+v",
		loss0, lossN, rounds, two, twoSamples, got[procs[2].peerID(t)], got[procs[3].peerID(t)],
		samples[procs[2].peerID(t)], samples[procs[3].peerID(t)], rep)
	for _, p := range procs[2:] {
		n, ns := got[p.peerID(t)], samples[p.peerID(t)]
		if n == 0 {
			t.Fatalf("%s contributed nothing: %v", p.Name, got)
		}
		if r := float64(two) / float64(n); r < 1.5 || r > 2.6 {
			t.Errorf("the 2-rank trainer got %.2f times %s's microshards (%d vs %d), not about twice", r, p.Name, two, n)
		}
		// Twice the samples, not four times: as many steps as a 1-rank trainer, each
		// reading a batch on each of its two ranks.
		if r := float64(twoSamples) / float64(ns); r < 1.5 || r > 2.6 {
			t.Errorf("the 2-rank trainer trained %.2f times %s's samples (%d vs %d), not about twice", r, p.Name, twoSamples, ns)
		}
	}
}

// TestRankKilledMidWindow: kill -9 one rank of the 2-rank trainer while it trains a
// window: the worker fails the window (RankFailed), the trainer gives its lease back, the
// worker restarts its ranks, the trainer contributes again, and the audit finds nothing
// lost and nothing merged twice.
func TestRankKilledMidWindow(t *testing.T) {
	const rounds = 6
	procs := ranksSwarm(t, t.TempDir(), rounds, 60, 0.1)
	startSwarm(t, procs)
	two := procs[1]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Wait for round 2 to be leased to it and its window to be under way.
	var victim int
	var killedRound uint64
	Eventually(t, 4*time.Minute, "trainer-1 training a window of round 2 or later", func() bool {
		st, err := two.Status(ctx)
		if err != nil || len(st.Leases) == 0 || st.Leases[0].Round < 2 {
			return false
		}
		w, _ := st.Worker.(map[string]any)
		devices, _ := w["devices"].([]any)
		if w["state"] != "busy" || len(devices) != 2 {
			return false
		}
		d, _ := devices[1].(map[string]any)
		pid, _ := d["pid"].(float64)
		victim, killedRound = int(pid), st.Leases[0].Round
		return victim > 0
	})
	time.Sleep(300 * time.Millisecond) // into the window's steps
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatalf("kill rank 1 (pid %d): %v", victim, err)
	}
	t.Logf("killed rank 1 of trainer-1 (pid %d) in its window of round %d", victim, killedRound)
	Eventually(t, time.Minute, "trainer-1 to give its lease back", func() bool {
		return strings.Contains(two.Logs(), "released lease") && strings.Contains(two.Logs(), "RankFailed")
	})
	waitAll(t, procs, 8*time.Minute)
	rep := audit(t, procs[0])
	merged, _ := mergedBy(t, procs[0], killedRound+1)
	after := merged[two.peerID(t)]
	if after == 0 {
		t.Fatalf("trainer-1 contributed nothing after its rank was killed (round %d)", killedRound)
	}
	var failed []string
	for _, line := range strings.Split(two.Logs(), "\n") {
		if strings.Contains(line, `msg="lease failed"`) || strings.Contains(line, `msg="released lease"`) {
			failed = append(failed, line)
		}
	}
	t.Logf("after the kill in round %d: trainer-1 merged %d microshards in later rounds; audit %+v; its failed windows:\n%s",
		killedRound, after, rep, strings.Join(failed, "\n"))
	if len(failed) == 0 || !strings.Contains(failed[0], "RankFailed") {
		t.Fatalf("no window failed with the ranks restarted:\n%s", two.Logs())
	}
}
