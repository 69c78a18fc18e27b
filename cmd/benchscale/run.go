package main

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"gopkg.in/yaml.v3"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/dataset"
	"github.com/p2pnode/p2pnode/internal/freeport"
	"github.com/p2pnode/p2pnode/synth"
)

// settings are the knobs of a run (see the package comment).
type settings struct {
	sizes      []int64
	trainers   []int
	validators int
	rounds     int
	dir        string
	timeout    time.Duration
	keep       bool
}

// innerSteps is each trainer's window; with synth's 1 ms per modelled step the training
// cost is fixed at innerSteps ms whatever the model size (reported apart).
const (
	innerSteps   = 10
	perTrainer   = 2
	shardBytes   = 256
	synthStepSec = 0.001
)

func getenv(k, def string) string {
	if v := strings.TrimSpace(os.Getenv(k)); v != "" {
		return v
	}
	return def
}

// parseCount reads 1M, 10M, 1B, 250K or a plain number of parameters.
func parseCount(s string) (int64, error) {
	s = strings.ToUpper(strings.TrimSpace(s))
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1e3, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1e6, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "B"), strings.HasSuffix(s, "G"):
		mult, s = 1e9, s[:len(s)-1]
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("parameter count %q: want e.g. 1M, 10M, 1B", s)
	}
	n := int64(f * float64(mult))
	if n <= int64(synth.Layout().Params()) {
		return 0, fmt.Errorf("parameter count %d: the synthetic model alone has %d", n, synth.Layout().Params())
	}
	return n, nil
}

func loadSettings() (settings, error) {
	s := settings{}
	for _, f := range strings.Split(getenv("BENCH_SCALE_SIZES", "1M,10M,100M,1B"), ",") {
		n, err := parseCount(f)
		if err != nil {
			return s, fmt.Errorf("BENCH_SCALE_SIZES: %w", err)
		}
		s.sizes = append(s.sizes, n)
	}
	for _, f := range strings.Split(getenv("BENCH_SCALE_TRAINERS", "3,8,16"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return s, fmt.Errorf("BENCH_SCALE_TRAINERS: %q is not a trainer count", f)
		}
		s.trainers = append(s.trainers, n)
	}
	var err error
	if s.validators, err = strconv.Atoi(getenv("BENCH_SCALE_VALIDATORS", "2")); err != nil || s.validators < 1 {
		return s, fmt.Errorf("BENCH_SCALE_VALIDATORS: want a count >= 1")
	}
	if s.rounds, err = strconv.Atoi(getenv("BENCH_SCALE_ROUNDS", "2")); err != nil || s.rounds < 1 {
		return s, fmt.Errorf("BENCH_SCALE_ROUNDS: want a count >= 1")
	}
	if s.timeout, err = time.ParseDuration(getenv("BENCH_SCALE_TIMEOUT", "30m")); err != nil {
		return s, fmt.Errorf("BENCH_SCALE_TIMEOUT: %w", err)
	}
	s.dir = getenv("BENCH_SCALE_DIR", filepath.Join(os.TempDir(), "p2pnode-bench-scale"))
	s.keep = os.Getenv("BENCH_SCALE_KEEP") == "1"
	return s, nil
}

func runBench() error {
	s, err := loadSettings()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return err
	}
	fmt.Printf("bench-scale: %d validators (quorum %d), %d round(s) per row (the table shows the last), %d cores, %.1f GB RAM available, %.1f GB free on %s, load average %s\n",
		s.validators, s.validators/2+1, s.rounds, runtime.NumCPU(), gb(memAvailable()), gb(diskFree(s.dir)), s.dir, loadAvg())
	fmt.Printf("each node a p2pnode process on loopback TCP; the synthetic workload runs in a worker process per call; training cost fixed at %d steps × %.0f ms = %.3f s (modelled, reported by the workload), the train column is the worker's wall time (load base pack, copy, write trained pack)\n\n",
		innerSteps, synthStepSec*1000, innerSteps*synthStepSec)
	tab := newTable()
	tab.header()
	est := loadEstimator(s.dir)
	for _, p := range s.sizes {
		for _, t := range s.trainers {
			need := est.need(p, t, s.validators, s.rounds)
			freeDisk, freeMem := diskFree(s.dir), memAvailable()
			if need.disk > freeDisk-4<<30 || need.ram > freeMem-2<<30 {
				tab.skip(p, t, fmt.Sprintf("does not fit: needs ~%.0f GB disk (%.0f free), ~%.0f GB RAM (%.0f available)",
					gb(need.disk), gb(freeDisk), gb(need.ram), gb(freeMem)))
				continue
			}
			start := time.Now()
			r, err := runRow(s, p, t)
			if err != nil {
				tab.skip(p, t, "failed: "+err.Error())
				continue
			}
			r.wall = time.Since(start)
			est.learn(r)
			tab.row(r)
		}
	}
	fmt.Printf("\nload average at the end: %s\n", loadAvg())
	tab.notes()
	return nil
}

// proc is one node process of a row.
type proc struct {
	name, dir string
	validator bool
	cmd       *exec.Cmd
	done      chan error
}

func runRow(s settings, params int64, trainers int) (*rowResult, error) {
	dir := filepath.Join(s.dir, fmt.Sprintf("%s-%dt", countName(params), trainers))
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if !s.keep {
		defer os.RemoveAll(dir)
	}
	pad := int(params) - int(synth.Layout().Params())
	data := filepath.Join(dir, "data")
	if err := synth.WriteDataset(data, perTrainer*trainers*(s.rounds+1), 1); err != nil {
		return nil, err
	}
	def := config.Default()
	m, err := dataset.Build(data, "synth", def.Node.ChunkSize)
	if err != nil {
		return nil, err
	}
	if err := m.Write(filepath.Join(data, dataset.ManifestFile)); err != nil {
		return nil, err
	}
	n := s.validators + trainers
	type ident struct {
		id   string
		key  string
		port int
	}
	ids := make([]ident, n)
	var vids, boot []string
	for i := range ids {
		key, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			return nil, err
		}
		pid, err := peer.IDFromPrivateKey(key)
		if err != nil {
			return nil, err
		}
		raw, err := crypto.MarshalPrivateKey(key)
		if err != nil {
			return nil, err
		}
		ids[i].id = pid.String()
		ids[i].key = filepath.Join(dir, nodeName(i, s.validators), "identity.key")
		if err := os.MkdirAll(filepath.Dir(ids[i].key), 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(ids[i].key, raw, 0o600); err != nil {
			return nil, err
		}
		if ids[i].port, err = freeport.TCP(); err != nil {
			return nil, err
		}
		if i < s.validators {
			vids = append(vids, ids[i].id)
			boot = append(boot, fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", ids[i].port, ids[i].id))
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var procs []*proc
	defer func() {
		for _, p := range procs {
			if p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
	}()
	for i := range n {
		name := nodeName(i, s.validators)
		ndir := filepath.Join(dir, name)
		cfg := config.Default()
		cfg.Node.StoreDir = filepath.Join(ndir, "store")
		cfg.Node.Identity = ids[i].key
		cfg.Node.Listen = []string{fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", ids[i].port)}
		cfg.Node.HTTP = "127.0.0.1:0" // the node's /metrics give the bytes it moved
		cfg.Node.DHT, cfg.Node.MDNS = false, false
		cfg.Node.StreamDeadline = 2 * time.Minute
		for _, b := range boot {
			if !strings.HasSuffix(b, ids[i].id) {
				cfg.Node.Bootstrap = append(cfg.Node.Bootstrap, b)
			}
		}
		cfg.Experiment.ID = "bench-scale"
		cfg.Experiment.Rounds = s.rounds
		cfg.Experiment.Validators = vids
		cfg.Experiment.Quorum = s.validators/2 + 1
		cfg.Experiment.Roles = []string{config.RoleTrainer}
		if i < s.validators {
			cfg.Experiment.Roles = []string{config.RoleValidator}
		}
		cfg.Dataset.Root = data
		cfg.Dataset.Manifest = filepath.Join(data, dataset.ManifestFile)
		cfg.Dataset.Prepare = false
		cfg.Dataset.MicroshardBytes = shardBytes
		cfg.Protocol.InnerSteps = innerSteps
		cfg.Protocol.DiLoCo = config.DiLoCo{OuterLR: 1, Momentum: 0.5, Nesterov: true}
		cfg.Lease.MicroshardsPerTrainer = perTrainer
		cfg.Lease.MinGroup = trainers // every trainer works in every round
		// No deadline of the protocol's may cut a slow transfer on a loaded machine: the row
		// has its own timeout.
		cfg.Lease.RoundTimeout = s.timeout
		cfg.Lease.MinDeadline = s.timeout
		cfg.Lease.FirstDeadline = s.timeout
		if err := cfg.Validate(); err != nil {
			return nil, fmt.Errorf("%s config: %w", name, err)
		}
		b, err := yaml.Marshal(cfg)
		if err != nil {
			return nil, err
		}
		cfgPath := filepath.Join(ndir, "config.yaml")
		if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
			return nil, err
		}
		stderr, err := os.Create(filepath.Join(ndir, "stderr.txt"))
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(exe, "node", "-config", cfgPath, "-pad", strconv.Itoa(pad),
			"-log", filepath.Join(ndir, "log.jsonl"), "-out", filepath.Join(ndir, "result.json"))
		cmd.Stdout, cmd.Stderr = stderr, stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			stderr.Close()
			return nil, err
		}
		p := &proc{name: name, dir: ndir, validator: i < s.validators, cmd: cmd, done: make(chan error, 1)}
		go func() { p.done <- cmd.Wait(); stderr.Close() }()
		procs = append(procs, p)
	}
	deadline := time.After(s.timeout)
	for _, p := range procs {
		select {
		case err := <-p.done:
			p.done <- err
			if err != nil {
				tail, _ := os.ReadFile(filepath.Join(p.dir, "stderr.txt"))
				return nil, fmt.Errorf("%s: %v %s (logs in %s)", p.name, err, lastLine(string(tail)), p.dir)
			}
		case <-deadline:
			return nil, fmt.Errorf("the round did not finish within BENCH_SCALE_TIMEOUT=%s (%s still running)", s.timeout, p.name)
		}
	}
	return collect(params, trainers, s.rounds, procs)
}

func nodeName(i, validators int) string {
	if i < validators {
		return fmt.Sprintf("validator-%d", i)
	}
	return fmt.Sprintf("trainer-%d", i-validators)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

func countName(p int64) string {
	switch {
	case p >= 1e9 && p%1e9 == 0:
		return fmt.Sprintf("%dB", p/1e9)
	case p >= 1e6 && p%1e6 == 0:
		return fmt.Sprintf("%dM", p/1e6)
	case p >= 1e3 && p%1e3 == 0:
		return fmt.Sprintf("%dK", p/1e3)
	}
	return strconv.FormatInt(p, 10)
}

func gb(b int64) float64 { return float64(b) / 1e9 }

func memAvailable() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n << 10
		}
	}
	return 0
}

func diskFree(dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0
	}
	return int64(st.Bavail) * st.Bsize
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// estimator says what a row needs before it runs: disk from what each role stores, memory
// from the peak RSS per model byte measured in the rows run so far (or defaults before any).
type estimator struct {
	// ratios are the largest peak anonymous RSS per model byte seen per role.
	Leader, Follower, Trainer, Worker float64
	// path keeps them between runs (rows of 100 M parameters take minutes each, and a
	// quick run of one of them should inform the next run's estimate of the larger rows).
	path string
}

// loadEstimator reads the ratios an earlier run kept in dir (none: the defaults).
func loadEstimator(dir string) *estimator {
	e := &estimator{path: filepath.Join(dir, "rss-ratios.json")}
	_ = readJSON(e.path, e)
	return e
}

type need struct{ disk, ram int64 }

// need: in each round a trainer stores the base params, the trained pack (scratch) and its
// delta; a validator every contribution and the next params and momentum, on top of
// genesis's params and its scratch copy (nothing pruned, to be safe).
func (e *estimator) need(params int64, trainers, validators, rounds int) need {
	m := 4 * params
	t, v, r := int64(trainers), int64(validators), int64(rounds)
	disk := t*(1+3*r)*m + v*(2+r*(t+2))*m + 1<<30
	ratio := func(seen, def float64) float64 {
		if seen > 0 {
			return seen
		}
		return def
	}
	ram := ratio(e.Leader, 1.5)*float64(m) + float64(validators-1)*ratio(e.Follower, 1.5)*float64(m) +
		float64(trainers)*(ratio(e.Trainer, 0.5)+ratio(e.Worker, 1.5))*float64(m) + float64(validators+2*trainers)*100e6
	return need{disk: disk, ram: int64(ram)}
}

// learn keeps the ratios of rows of 100 M parameters and more (smaller rows are dominated
// by the fixed cost of a Go process and libp2p, which the ratio would scale up wrongly).
func (e *estimator) learn(r *rowResult) {
	if r.params < 100e6 {
		return
	}
	e.Leader = max(e.Leader, r.rss.leaderAnon)
	e.Follower = max(e.Follower, r.rss.followerAnon)
	e.Trainer = max(e.Trainer, r.rss.trainerAnon)
	e.Worker = max(e.Worker, r.rss.workerAnon)
	if e.path != "" {
		if b, err := json.Marshal(e); err == nil {
			_ = os.WriteFile(e.path, b, 0o644)
		}
	}
}

var errNoRound = errors.New("no round in the logs")

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
