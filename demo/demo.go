// Package demo runs a small swarm on this machine: one validator (which is also the
// bootstrap node) and a few trainers, each a real `p2pnode run` process talking libp2p over
// loopback TCP, training the digits workload (or the lm transformer with Workload "lm", or
// the charlm GRU with Workload "charlm"). It writes their configs, prepares the
// dataset once, starts the processes, relays the validator's progress and stops everyone
// when the experiment's rounds are done.
package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/p2pnode/p2pnode/codecs"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/internal/freeport"
	"github.com/p2pnode/p2pnode/node"
	"github.com/p2pnode/p2pnode/p2p"
)

// Options configure a demo run.
type Options struct {
	Dir      string // everything goes here (configs, stores, logs, data)
	Trainers int
	Rounds   int
	Binary   string // the p2pnode executable to run
	Out      io.Writer
	Log      *slog.Logger
	// Fresh discards an earlier demo's state instead of resuming it.
	Fresh bool
	// Workload is "digits" (default: an MLP on the 8x8 digits) or "lm" (the byte-level
	// transformer of p2ptrain.workloads.lm on the Python standard library's sources) or
	// "charlm" (the byte-level GRU of p2ptrain.workloads.charlm on the same sources).
	Workload string
	// Preset is the lm workload's preset (default "tiny").
	Preset string
	// Codec is protocol.codec for every node (default: the config's default, fp32).
	Codec string
	// Overlap is protocol.overlap for every node ("": none; "eager").
	Overlap string
	// Seed is experiment.seed (0: 1): the initial model, the trainers' batch orders and,
	// through the heads, the lease draws. The dataset and its held-out split stay.
	Seed int64
	// Momentum, when set, is protocol.diloco.momentum for every node instead of the
	// workload's default (0.5).
	Momentum *float64
	// OuterLR, when set, is protocol.diloco.outer_lr for every node instead of the
	// default: 1.0, and on lm config.OuterLRFor's (1.5 with sparse), or
	// FP32OverlapOuterLR with fp32 and overlap eager.
	OuterLR *float64
}

// FP32OverlapOuterLR is the lm demo's outer lr with fp32 and protocol.overlap eager.
const FP32OverlapOuterLR = 0.5

// Workloads the demo can train.
const (
	WorkloadDigits = "digits"
	WorkloadLM     = "lm"
	WorkloadCharLM = "charlm"
)

// Result is what the demo measured.
type Result struct {
	Rounds        int
	FinalAccuracy float64
	FinalLoss     float64 // held-out loss of the last round (nats per token), when printed
	Seconds       float64
	SecondsPerRnd float64
}

var (
	progressLine = regexp.MustCompile(`^round\s+(\d+)/\d+.*held-out accuracy\s+([\d.]+)%`)
	lossField    = regexp.MustCompile(`held-out loss\s+([\d.]+)`)
)

// Run runs the demo swarm until its rounds are done or ctx ends.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Trainers < 1 {
		return nil, errors.New("demo: need at least one trainer")
	}
	if err := o.checkWorkload(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	o.Dir = dir
	if o.Fresh {
		if err := os.RemoveAll(o.Dir); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	cfgs, err := WriteConfigs(o)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Out, "demo: preparing the %s dataset in %s\n", o.workload(), cfgs[0].Dataset.Root)
	if _, err := node.PrepareDataset(ctx, cfgs[0], nil, o.Log); err != nil {
		return nil, err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	start := time.Now()
	var mu sync.Mutex
	res := &Result{}
	names := Names(o.Trainers)
	for i, cfg := range cfgs {
		name := names[i]
		var relay func(string)
		if i == 0 {
			relay = func(line string) {
				if m := progressLine.FindStringSubmatch(line); m != nil {
					var r int
					var acc float64
					fmt.Sscan(m[1], &r)
					fmt.Sscan(m[2], &acc)
					mu.Lock()
					if r >= res.Rounds { // metrics that came late for an earlier round do not count
						res.Rounds, res.FinalAccuracy = r, acc/100
						if l := lossField.FindStringSubmatch(line); l != nil {
							fmt.Sscan(l[1], &res.FinalLoss)
						}
					}
					mu.Unlock()
				}
				fmt.Fprintln(o.Out, line)
			}
		}
		p, err := startProc(ctx, o.Binary, name, filepath.Join(o.Dir, name+".yaml"), filepath.Join(o.Dir, name+".log"), relay)
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
		if i == 0 {
			fmt.Fprintf(o.Out, "demo: validator %s listening on %s\n", cfg.Experiment.Validators[0], cfg.Node.Listen[0])
		}
	}
	fmt.Fprintf(o.Out, "demo: %d trainers started; logs in %s/*.log\n", o.Trainers, o.Dir)
	// The validator exits by itself after the last round; trainers stop when it does.
	errc := make(chan error, len(procs))
	for _, p := range procs {
		go func(p *proc) { errc <- p.wait() }(p)
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-procs[0].done:
		if err := procs[0].err; err != nil {
			return nil, fmt.Errorf("demo: validator failed: %w (see %s)", err, procs[0].logPath)
		}
	case err := <-errc:
		for _, p := range procs {
			if p.exited() && p.err != nil {
				return nil, fmt.Errorf("demo: %s failed: %w (see %s)", p.name, p.err, p.logPath)
			}
		}
		if err != nil {
			return nil, err
		}
		<-procs[0].done
	}
	res.Seconds = time.Since(start).Seconds()
	if res.Rounds > 0 {
		res.SecondsPerRnd = res.Seconds / float64(res.Rounds)
	}
	return res, nil
}

// Names returns the node names of a swarm with n trainers: "validator", "trainer-1", ...
func Names(n int) []string {
	names := []string{"validator"}
	for i := 1; i <= n; i++ {
		names = append(names, fmt.Sprintf("trainer-%d", i))
	}
	return names
}

func (o Options) workload() string {
	if o.Workload == "" {
		return WorkloadDigits
	}
	return o.Workload
}

func (o Options) checkWorkload() error {
	switch o.workload() {
	case WorkloadDigits, WorkloadCharLM:
		if o.Preset != "" {
			return fmt.Errorf("demo: --preset %q: only the lm workload has presets", o.Preset)
		}
	case WorkloadLM:
	default:
		return fmt.Errorf("demo: --workload %q: unknown workload (want %s, %s or %s)", o.Workload, WorkloadDigits, WorkloadLM, WorkloadCharLM)
	}
	return nil
}

// WriteConfigs writes o.Dir/<name>.yaml for one validator+bootstrap node and o.Trainers
// trainers (see Names) and returns them loaded. The validator's identity is created so that
// the trainers can name it as their bootstrap peer and the experiment's validator.
func WriteConfigs(o Options) ([]*config.Config, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if err := o.checkWorkload(); err != nil {
		return nil, err
	}
	key, err := p2p.LoadIdentity(filepath.Join(o.Dir, "validator", "identity.key"), o.Log)
	if err != nil {
		return nil, err
	}
	vid, err := p2p.PeerID(key)
	if err != nil {
		return nil, err
	}
	port, err := freeport.TCP()
	if err != nil {
		return nil, err
	}
	listen := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port)
	base := func(name string) *config.Config {
		c := config.Default()
		c.Node.StoreDir = name
		c.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
		c.Node.HTTP = "127.0.0.1:0"
		c.Node.DHT = false
		c.Experiment = config.Experiment{Network: "p2ptrain-demo", ID: "digits-demo", Validators: []string{vid}, Quorum: 1,
			Rounds: o.Rounds, Seed: max(o.Seed, 1), EvalEvery: 1}
		c.Dataset.Root = "data"
		c.Dataset.Manifest = "manifest.json"
		c.Dataset.MicroshardBytes = 16384
		// A window of 20 steps of 12 reads 240 examples, 4 of the 23 microshards (62.5
		// examples each), so three trainers' windows fit the epoch without repeating an
		// example (lease.WindowShare raises microshards_per_trainer to 4) and an epoch is
		// two rounds of 12 and 11 microshards: the tail round's windows are 20, 20 and 15
		// steps. At batch 32 they would need 11 each, 33 > 23, and each window would loop
		// over its 3 microshards 3.4 times; at batch 16 (6 each) every other round was a
		// tail of 7, 7 and 3 steps, whose small updates the calibrated cosine screen
		// rejected (docs/design-notes.md).
		c.Workload.Config = map[string]any{"hidden": 128, "batch_size": 12, "lr": 0.001}
		c.Protocol.InnerSteps = 20
		// Heavy-ball outer momentum for digits: at these settings (3 trainers, H 20) it
		// trails one node with the same compute by less than Nesterov does
		// (docs/design-notes.md). charlm too (below), and lm with fp32 (below).
		c.Protocol.DiLoCo = config.DiLoCo{OuterLR: 1.0, Momentum: 0.5, Nesterov: false}
		c.Lease.MicroshardsPerTrainer = 3
		c.Lease.MinGroup = 1
		c.Lease.RoundTimeout = 2 * time.Minute
		if o.workload() == WorkloadLM {
			preset := o.Preset
			if preset == "" {
				preset = "tiny"
			}
			c.Experiment.ID = "lm-" + preset + "-demo"
			c.Workload.Factory = "p2ptrain.workloads.lm:LM"
			c.Workload.Config = map[string]any{"preset": preset}
			// One 64 KiB shard file per microshard: two per trainer and window.
			c.Dataset.MicroshardBytes = 65536
			c.Lease.MicroshardsPerTrainer = 2
			// A transformer on CPUs: rounds take tens of seconds, not a few.
			c.Lease.RoundTimeout = 10 * time.Minute
		}
		if o.workload() == WorkloadCharLM {
			c.Experiment.ID = "charlm-demo"
			c.Workload.Factory = "p2ptrain.workloads.charlm:CharLM"
			c.Workload.Config = map[string]any{}
			// Heavy ball, as for digits: it trails one node with the same compute by less
			// than Nesterov does (docs/diloco-cost.md).
			// The workload's 64 KiB shard files, two per trainer and window, as for lm.
			c.Dataset.MicroshardBytes = 65536
			c.Lease.MicroshardsPerTrainer = 2
			c.Lease.RoundTimeout = 10 * time.Minute
		}
		if o.Codec != "" {
			c.Protocol.Codec = diloco.Codec(o.Codec)
		}
		c.Protocol.Overlap = o.Overlap
		if o.workload() == WorkloadLM {
			// sparse's larger outer step is lm's: the other workloads keep 1.0
			// (docs/wan.md).
			c.Protocol.DiLoCo.OuterLR = config.OuterLRFor(c.Protocol)
			// Heavy ball with fp32: 2.7-3.5 % lower held-out loss than Nesterov over
			// rounds 17-24 of lm tiny on three seeds; with sparse it lost 2.0-3.0 % at
			// lr 1.5, 2.2-3.0 % at 1.0, and sparse keeps Nesterov; fp16 and int8 were not
			// measured and keep it too (docs/diloco-cost.md).
			c.Protocol.DiLoCo.Nesterov = c.Protocol.Codec != codecs.FP32
			// fp32 under overlap: a window trained ahead is a round late, and a full-size
			// late update at outer lr 1.0 cost 13-14 % held-out loss over rounds 17-24 (heavy
			// ball; Nesterov 25 %); at 0.5 it was 1.8 % (docs/diloco-cost.md, Overlap
			// with fp32). The sparse codec sends a fraction of each update and keeps 1.5.
			if c.Protocol.Codec == codecs.FP32 && c.Protocol.Overlap == config.OverlapEager {
				c.Protocol.DiLoCo.OuterLR = FP32OverlapOuterLR
			}
		}
		if o.Momentum != nil {
			c.Protocol.DiLoCo.Momentum = *o.Momentum
		}
		if o.OuterLR != nil {
			c.Protocol.DiLoCo.OuterLR = *o.OuterLR
		}
		return c
	}
	var out []*config.Config
	v := base("validator")
	v.Node.HTTP = config.DefaultHTTP // the swarm's dashboard, where the README says
	v.Node.Listen = []string{listen}
	v.Experiment.Roles = []string{config.RoleValidator, config.RoleBootstrap}
	out = append(out, v)
	for i := 1; i <= o.Trainers; i++ {
		t := base(fmt.Sprintf("trainer-%d", i))
		t.Experiment.Roles = []string{config.RoleTrainer}
		t.Experiment.EvalEvery = 0
		t.Node.Bootstrap = []string{listen + "/p2p/" + vid}
		out = append(out, t)
	}
	names := Names(o.Trainers)
	for i, c := range out {
		b, err := yaml.Marshal(c)
		if err != nil {
			return nil, err
		}
		header := fmt.Sprintf("# Written by `p2pnode demo`: the %s of a local demo swarm.\n", names[i])
		path := filepath.Join(o.Dir, names[i]+".yaml")
		if err := os.WriteFile(path, append([]byte(header), b...), 0o644); err != nil {
			return nil, err
		}
		loaded, err := config.Load(path)
		if err != nil {
			return nil, fmt.Errorf("demo config: %w", err)
		}
		out[i] = loaded
	}
	return out, nil
}

// proc is one node process of the demo.
type proc struct {
	name, logPath string
	cmd           *exec.Cmd
	done          chan struct{}
	err           error
}

func startProc(ctx context.Context, bin, name, cfg, logPath string, relay func(string)) (*proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run", "--config", cfg, "--log-format", "text")
	cmd.Dir = filepath.Dir(cfg)
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			if relay != nil && (strings.HasPrefix(line, "round") || strings.HasPrefix(line, "dashboard ")) {
				relay(line)
			}
		}
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) wait() error { <-p.done; return p.err }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop asks the process to stop (SIGTERM), then kills its group if it lingers.
func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}
