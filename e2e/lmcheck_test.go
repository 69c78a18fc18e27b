package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/demo"
	"github.com/p2pnode/p2pnode/internal/testenv"
)

// TestLMLearningCheck is a measurement, run on request (P2PNODE_LM_CHECK=1; meant for a
// GPU): the lm workload's preset (P2PNODE_LM_CHECK_PRESET, default small) trained by a
// swarm of 3 trainers (H inner steps each per round, all three merged every round, DiLoCo at
// the demo's 1.0/0.5) and by one node with the same compute per round (3H steps, outer lr 1
// and no momentum: the head is its local model, so this is plain training). Leases start at
// 2 microshards per trainer and 6 for the one node; lease.WindowShare raises both to what a
// window reads where the dataset holds it (small at H 100: 7 per trainer, 21 a round, and
// 19), so both read about the same text per round. Both evaluate every head on the same held-out text; the
// test logs the rows as they come and, at the end, both curves, the swarm's excess loss and
// its mean over the last third of the rounds. It fails only if a run breaks.
// scripts/lmcheck-gpu.sh runs several side by side; docs/diloco-cost.md has the results.
func TestLMLearningCheck(t *testing.T) {
	if os.Getenv("P2PNODE_LM_CHECK") == "" {
		t.Skip("a measurement: set P2PNODE_LM_CHECK=1 to run it")
	}
	env := func(k string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
			return v
		}
		return def
	}
	preset := os.Getenv("P2PNODE_LM_CHECK_PRESET")
	if preset == "" {
		preset = "small"
	}
	// P2PNODE_LM_CHECK_WORKLOAD=digits runs the same comparison on the digits MLP (its
	// held-out accuracy is compared instead of the loss; no preset), =charlm on the charlm
	// GRU (its held-out loss, at the workload's own settings; no preset).
	workload, metric := demo.WorkloadLM, "loss"
	switch os.Getenv("P2PNODE_LM_CHECK_WORKLOAD") {
	case demo.WorkloadDigits:
		workload, metric, preset = demo.WorkloadDigits, "accuracy", ""
	case demo.WorkloadCharLM:
		workload, preset = demo.WorkloadCharLM, ""
	}
	seed := int64(env("P2PNODE_LM_CHECK_SEED", 1))
	rounds, h := env("P2PNODE_LM_CHECK_ROUNDS", 10), env("P2PNODE_LM_CHECK_H", 50)
	wcfg := map[string]any{"preset": preset}
	switch workload {
	case demo.WorkloadDigits:
		wcfg = map[string]any{"hidden": 128, "batch_size": 32, "lr": 0.001}
	case demo.WorkloadCharLM:
		wcfg = map[string]any{}
	}
	if b := env("P2PNODE_LM_CHECK_BATCH", 0); b > 0 {
		wcfg["batch_size"] = b
	}
	if c := env("P2PNODE_LM_CHECK_CONTEXT", 0); c > 0 {
		wcfg["context"] = c
	}
	if e := env("P2PNODE_LM_CHECK_EVAL_BYTES", 0); e > 0 {
		wcfg["eval_bytes"] = e
	}
	// P2PNODE_LM_CHECK_CONFIG: more workload.config keys as JSON, e.g. {"warmup": 0}.
	if extra := os.Getenv("P2PNODE_LM_CHECK_CONFIG"); extra != "" {
		if err := json.Unmarshal([]byte(extra), &wcfg); err != nil {
			t.Fatalf("P2PNODE_LM_CHECK_CONFIG: %v", err)
		}
	}
	device := os.Getenv("P2PNODE_LM_CHECK_DEVICE")
	precision := os.Getenv("P2PNODE_LM_CHECK_PRECISION")
	python := os.Getenv("P2PNODE_LM_CHECK_PYTHON")
	// P2PNODE_LM_CHECK_DECAY=fit ends each run's cosine where the run ends: the swarm's
	// trainers at H × rounds of their own steps, the one node at 3H × rounds (the lm
	// workload's decay_steps; its schedule follows the optimizer's own step count). Without
	// it both use the preset's horizon, which the one node, taking three times the steps,
	// travels three times as far along.
	fit := os.Getenv("P2PNODE_LM_CHECK_DECAY") == "fit"
	if fit && workload != demo.WorkloadLM {
		t.Fatalf("P2PNODE_LM_CHECK_DECAY=fit is for the lm workload (its decay_steps), not %s", workload)
	}
	setup := func(c *config.Config, stepsPerRound int) {
		c.Workload.Config = maps.Clone(wcfg)
		if fit {
			c.Workload.Config["decay_steps"] = stepsPerRound * rounds
		}
		c.Experiment.Seed = seed
		if python != "" {
			c.Workload.Interpreter = python
		}
		if device != "" {
			c.Workload.Device = device
		}
		if precision != "" {
			c.Workload.Precision = precision
		}
		c.Workload.TrainTimeout = 30 * time.Minute
		c.Lease.RoundTimeout = 30 * time.Minute
	}
	dir := t.TempDir()
	swarm := swarmOf(t, demo.Options{Dir: filepath.Join(dir, "swarm"), Trainers: 3, Rounds: rounds, Workload: workload, Preset: preset},
		func(_ string, c *config.Config) {
			setup(c, h)
			c.Protocol.InnerSteps = h
			c.Lease.MicroshardsPerTrainer = 2
			c.Lease.MinGroup = 3
			// P2PNODE_LM_CHECK_OUTER="lr,momentum,nesterov" replaces the demo's outer step (1.0,0.5
			// without Nesterov, but with it for lm on a codec other than fp32).
			if o := strings.Split(os.Getenv("P2PNODE_LM_CHECK_OUTER"), ","); len(o) == 3 {
				lr, _ := strconv.ParseFloat(o[0], 64)
				mom, _ := strconv.ParseFloat(o[1], 64)
				c.Protocol.DiLoCo = config.DiLoCo{OuterLR: lr, Momentum: mom, Nesterov: o[2] == "true"}
			}
		})
	if err := exec.Command(swarm[0].Cfg.Workload.Interpreter, "-c", "import torch, numpy").Run(); err != nil {
		testenv.Missing(t, "%s cannot import torch and numpy: %v", swarm[0].Cfg.Workload.Interpreter, err)
	}
	solo := swarmOf(t, demo.Options{Dir: filepath.Join(dir, "solo"), Trainers: 1, Rounds: rounds, Workload: workload, Preset: preset},
		func(_ string, c *config.Config) {
			setup(c, 3*h)
			c.Protocol.InnerSteps = 3 * h
			c.Lease.MicroshardsPerTrainer = 6
			c.Protocol.DiLoCo = config.DiLoCo{OuterLR: 1, Momentum: 0, Nesterov: false}
		})
	// row is round r's line of the table, once both runs have evaluated its head.
	row := func(r int) (string, float64, float64, bool) {
		var ls, l1 float64
		var ok1, ok2 bool
		if metric == "accuracy" {
			ls, ok1 = swarm[0].AccuracyAt(r)
			l1, ok2 = solo[0].AccuracyAt(r)
		} else {
			ls, ok1 = swarm[0].MetricAt(r, metric)
			l1, ok2 = solo[0].MetricAt(r, metric)
		}
		if !ok1 || !ok2 {
			return "", 0, 0, false
		}
		return fmt.Sprintf("| %d | %d | %.4f | %.4f | %+.1f %% |\n", r, 3*h*r, ls, l1, 100*(ls/l1-1)), ls, l1, true
	}
	header := fmt.Sprintf("| round | inner steps (total) | swarm held-out %[1]s | one node held-out %[1]s | swarm / one node |\n|---|---|---|---|---|\n", metric)
	start := time.Now()
	for _, p := range append(swarm, solo...) {
		p.Start()
	}
	// Progress: the rows as they come (a run of the small preset takes minutes on a GPU,
	// hours on a CPU), so a run cut short still shows how far it got.
	stop := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		next, tick := 0, time.NewTicker(10*time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for ; next <= rounds; next++ {
				line, _, _, ok := row(next)
				if !ok {
					break
				}
				t.Logf("%.0fs %s", time.Since(start).Seconds(), strings.TrimSpace(line))
			}
		}
	}()
	stopProgress := func() { close(stop); <-progressDone }
	for _, p := range append(swarm, solo...) {
		if err := p.Wait(60 * time.Minute); err != nil {
			stopProgress()
			t.Fatalf("%s: %v", p.Name, err)
		}
	}
	stopProgress()
	var b strings.Builder
	fmt.Fprintf(&b, "preset %s %v (decay fit %v, precision %q): swarm of 3 trainers x H=%d (outer %+v) vs one node x %d steps per round, %d rounds, %.0fs\n",
		preset, wcfg, fit, precision, h, swarm[0].Cfg.Protocol.DiLoCo, 3*h, rounds, time.Since(start).Seconds())
	b.WriteString(header)
	// The summary: the mean over the last third of the rounds, as docs/diloco-cost.md reads them.
	lo := min(rounds-rounds/3+1, rounds)
	var sumS, sum1 float64
	var n int
	for r := 0; r <= rounds; r++ {
		line, ls, l1, ok := row(r)
		if !ok {
			continue
		}
		b.WriteString(line)
		if r >= lo {
			sumS, sum1, n = sumS+ls, sum1+l1, n+1
		}
	}
	if n > 0 {
		fmt.Fprintf(&b, "rounds %d-%d mean held-out %s: swarm %.4f, one node %.4f, swarm / one node %+.2f %%\n",
			lo, rounds, metric, sumS/float64(n), sum1/float64(n), 100*(sumS/sum1-1))
	}
	b.WriteString("swarm:\n" + swarm[0].Output() + "one node:\n" + solo[0].Output())
	t.Log("\n" + b.String())
	if out := os.Getenv("P2PNODE_LM_CHECK_OUT"); out != "" {
		_ = os.WriteFile(out, []byte(b.String()), 0o644)
	}
}
