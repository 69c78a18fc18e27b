package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/demo"
)

// TestLMBaseRound is a measurement, run on request (P2PNODE_LM_BASE=1, minutes on a CPU):
// one full round of the lm workload's base preset (86 M parameters, 344 MB fp32 packs)
// through 1 validator and 2 trainers, real processes with their Python workers. It checks
// that the round completes with both contributions merged and logs the wall time of each
// stage (from the nodes' logs) and the peak RSS of every Go process and Python worker.
func TestLMBaseRound(t *testing.T) {
	if os.Getenv("P2PNODE_LM_BASE") == "" {
		t.Skip("a measurement of minutes: set P2PNODE_LM_BASE=1 to run it")
	}
	steps := 2
	if s := os.Getenv("P2PNODE_LM_BASE_STEPS"); s != "" {
		steps, _ = strconv.Atoi(s)
	}
	dir := t.TempDir()
	procs := swarmOf(t, demo.Options{Dir: dir, Trainers: 2, Rounds: 1, Workload: demo.WorkloadLM, Preset: "base"}, func(_ string, c *config.Config) {
		// The base shape as it is (context 1024), one sequence per step, one held-out window.
		c.Workload.Config = map[string]any{"preset": "base", "batch_size": 1, "eval_bytes": 1025}
		c.Protocol.InnerSteps = steps
		c.Lease.MicroshardsPerTrainer = 1
		c.Lease.MinGroup = 2
		c.Lease.RoundTimeout = 30 * time.Minute
		c.Workload.TrainTimeout = 30 * time.Minute
		c.Workload.CallTimeout = 10 * time.Minute
	})
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	start := time.Now()
	for _, p := range procs {
		p.Start()
	}
	peaks := &rssPeaks{max: map[string]int64{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			for _, p := range procs {
				peaks.sample(p.Name, p.PID())
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	for _, p := range procs {
		if err := p.Wait(40 * time.Minute); err != nil {
			close(stop)
			t.Fatalf("%s: %v", p.Name, err)
		}
	}
	close(stop)
	wg.Wait()
	total := time.Since(start)
	v := procs[0]
	if _, ok := v.MetricAt(1, "loss"); !ok {
		t.Fatalf("no held-out loss for round 1:\n%s", v.Output())
	}
	if !regexp.MustCompile(`(?m)^round\s+1/1.*merged 2`).MatchString(v.Output()) {
		t.Fatalf("round 1 did not merge both trainers:\n%s", v.Output())
	}
	var b strings.Builder
	fmt.Fprintf(&b, "base preset, %d inner steps of batch 1 x 1024, 1 validator + 2 trainers: %.1fs from start to exit\n", steps, total.Seconds())
	b.WriteString(v.Output())
	for _, p := range procs {
		fmt.Fprintf(&b, "--- %s: stages (seconds since its start)\n", p.Name)
		b.WriteString(stages(p.Logs()))
	}
	b.WriteString("--- peak RSS (VmHWM)\n")
	b.WriteString(peaks.String())
	t.Log("\n" + b.String())
	if out := os.Getenv("P2PNODE_LM_BASE_OUT"); out != "" {
		_ = os.WriteFile(out, []byte(b.String()), 0o644)
	}
}

var (
	logTime   = regexp.MustCompile(`^time=(\S+)`)
	logMsg    = regexp.MustCompile(`msg="?([^"=]+?)"?(?:\s+\w+=|$)`)
	stageMsgs = []string{"python worker ready", "workload ready", "made genesis", "issued leases", "lease", "fetched", "trained",
		"published", "contribution", "merged", "proposed head", "canonical", "evaluated", "stopping", "done"}
)

// stages lists the log lines whose message names a stage, with seconds since the first line.
func stages(logs string) string {
	var b strings.Builder
	var t0 time.Time
	for _, line := range strings.Split(logs, "\n") {
		m := logTime.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		ts, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		if t0.IsZero() {
			t0 = ts
		}
		msg := ""
		if mm := logMsg.FindStringSubmatch(line); mm != nil {
			msg = mm[1]
		}
		for _, s := range stageMsgs {
			if strings.Contains(msg, s) {
				if len(line) > 220 {
					line = line[:220]
				}
				fmt.Fprintf(&b, "%8.1f  %s\n", ts.Sub(t0).Seconds(), strings.TrimSpace(line[len(m[0]):]))
				break
			}
		}
	}
	return b.String()
}

// rssPeaks keeps the highest VmHWM seen of each node and of each of its descendants.
type rssPeaks struct {
	mu  sync.Mutex
	max map[string]int64 // "<node> <comm> (pid)" -> bytes
}

func (r *rssPeaks) sample(node string, pid int) {
	if pid == 0 {
		return
	}
	for _, p := range append([]int{pid}, descendants(pid)...) {
		hwm, comm := vmHWM(p)
		if hwm == 0 {
			continue
		}
		key := fmt.Sprintf("%s %s (%d)", node, comm, p)
		r.mu.Lock()
		if hwm > r.max[key] {
			r.max[key] = hwm
		}
		r.mu.Unlock()
	}
}

func (r *rssPeaks) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(r.max))
	for k := range r.max {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%-40s %8.1f MiB\n", k, float64(r.max[k])/(1<<20))
	}
	return b.String()
}

func vmHWM(pid int) (int64, string) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, ""
	}
	defer f.Close()
	var hwm int64
	var name string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "Name:"); ok {
			name = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			hwm = kb << 10
		}
	}
	return hwm, name
}

// descendants are the processes whose parent chain leads to pid.
func descendants(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	parent := map[int]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		parent[p] = pp
	}
	var out []int
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out = append(out, p)
				break
			}
		}
	}
	sort.Ints(out)
	return out
}
