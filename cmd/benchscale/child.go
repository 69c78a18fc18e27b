package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/node"
	"github.com/p2pnode/p2pnode/pyruntime"
	"github.com/p2pnode/p2pnode/synth"
)

// peakKiB is this process's peak RSS (VmHWM of /proc/self/status), in KiB.
func peakKiB() int64 { return statusKiB("VmHWM:") }

// statusKiB is a field of /proc/self/status in KiB (-1 if absent).
func statusKiB(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return -1
}

// watchAnon samples RssAnon (heap, stacks, anonymous mappings: memory that is the
// process's own, unlike the file pages of mapped or cached artifacts that VmHWM also
// counts) every 50 ms until ctx ends, and keeps the largest.
func watchAnon(ctx context.Context, res *nodeResult, mu *sync.Mutex) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		v := statusKiB("RssAnon:")
		mu.Lock()
		res.PeakAnonKiB = max(res.PeakAnonKiB, v)
		mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// nodeResult is what a node process reports when its run ends.
type nodeResult struct {
	Peer    string `json:"peer"`
	PeakKiB int64  `json:"peak_kib"`
	// PeakAnonKiB is the largest RssAnon sampled (every 50 ms).
	PeakAnonKiB int64 `json:"peak_anon_kib"`
	// BytesIn and BytesOut are the libp2p bytes of the node's run (its
	// p2ptrain_node_protocol_bytes_total, last read shortly before the run ended).
	BytesIn  float64 `json:"bytes_in"`
	BytesOut float64 `json:"bytes_out"`
	Err      string  `json:"err,omitempty"`
}

// watchBytes reads the node's /metrics every 200 ms until ctx ends and keeps the last
// totals of p2ptrain_node_protocol_bytes_total by direction.
func watchBytes(ctx context.Context, n *node.Node, res *nodeResult, mu *sync.Mutex) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		addr := n.HTTPAddr()
		if addr == "" {
			continue
		}
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			continue
		}
		var in, out float64
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			l := sc.Text()
			if !strings.HasPrefix(l, "p2ptrain_node_protocol_bytes_total{") {
				continue
			}
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			if strings.Contains(l, `direction="in"`) {
				in += v
			} else {
				out += v
			}
		}
		resp.Body.Close()
		mu.Lock()
		res.BytesIn, res.BytesOut = in, out
		mu.Unlock()
	}
}

// runNode is one p2pnode (one role) in its own process: the config file's node, with the
// synthetic workload run by worker processes (procRuntime), logs as JSON lines at debug
// level in -log, and its peak RSS written to -out when the run ends.
func runNode(args []string) int {
	fs := flag.NewFlagSet("node", flag.ExitOnError)
	cfgPath := fs.String("config", "", "node config (yaml)")
	pad := fs.Int("pad", 0, "synthetic model padding (parameters)")
	logPath := fs.String("log", "", "log file (JSON lines)")
	outPath := fs.String("out", "", "result file (JSON)")
	_ = fs.Parse(args)
	lf, err := os.Create(*logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer lf.Close()
	log := slog.New(slog.NewJSONHandler(lf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	res := nodeResult{}
	var mu sync.Mutex
	err = func() error {
		cfg, err := config.Load(*cfgPath)
		if err != nil {
			return err
		}
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		rt := &procRuntime{exe: exe, pad: *pad, log: log.With("component", "bench-worker"), syn: synth.New(cfg.Node.StoreDir + "/scratch")}
		rt.syn.Pad = *pad
		n, err := node.New(cfg, node.Options{Runtime: rt, Logger: log, Progress: &progressLog{log: log}})
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		defer stop()
		wctx, wstop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); watchBytes(wctx, n, &res, &mu) }()
		go func() { defer wg.Done(); watchAnon(wctx, &res, &mu) }()
		err = n.Run(ctx)
		wstop()
		wg.Wait()
		res.Peer = n.Status().Peer
		return err
	}()
	res.PeakKiB = peakKiB()
	if err != nil {
		res.Err = err.Error()
		log.Error("bench node failed", "err", err)
	}
	b, _ := json.Marshal(res)
	if werr := os.WriteFile(*outPath, b, 0o644); werr != nil {
		fmt.Fprintln(os.Stderr, werr)
		return 1
	}
	if err != nil {
		return 1
	}
	return 0
}

// progressLog turns the node's progress lines (one per canonical head) into log records,
// so their times are on the same clock as the rest of the log.
type progressLog struct {
	log *slog.Logger
	buf []byte
}

func (p *progressLog) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		p.log.Info("progress", "line", string(p.buf[:i]))
		p.buf = p.buf[i+1:]
	}
}

// workerJob is what a worker process is asked to do (one call of pyruntime.Runtime).
type workerJob struct {
	Op      string              `json:"op"` // init, train, evaluate
	Scratch string              `json:"scratch"`
	Pad     int                 `json:"pad"`
	Seed    int64               `json:"seed,omitempty"`
	Out     string              `json:"out,omitempty"`
	Pack    string              `json:"pack,omitempty"`
	Job     *pyruntime.TrainJob `json:"job,omitempty"`
}

// workerReply is its answer.
type workerReply struct {
	Train   pyruntime.TrainResult `json:"train"`
	Metrics map[string]float64    `json:"metrics,omitempty"`
	PeakKiB int64                 `json:"peak_kib"`
	// AnonKiB is RssAnon as the call ends (Go keeps what it allocated: about its peak).
	AnonKiB int64  `json:"anon_kib"`
	Err     string `json:"err,omitempty"`
}

// procRuntime runs every call of the synthetic workload that touches the model (init,
// train, evaluate) in a child process, as the Python worker runs beside a real node: the
// node process's peak RSS is then the Go side's alone, and the worker's is reported apart.
type procRuntime struct {
	exe string
	pad int
	log *slog.Logger
	syn *synth.Runtime
}

func (r *procRuntime) call(ctx context.Context, j workerJob) (workerReply, error) {
	j.Scratch, j.Pad = r.syn.ScratchDir(), r.pad
	in, _ := json.Marshal(j)
	cmd := exec.CommandContext(ctx, r.exe, "worker")
	cmd.Stdin = bytes.NewReader(in)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	var rep workerReply
	if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
		return rep, fmt.Errorf("bench worker %s: %v (%v): %s", j.Op, err, jerr, errb.String())
	}
	r.log.Debug("worker call", "op", j.Op, "seconds", wall.Seconds(), "peak_kib", rep.PeakKiB, "anon_kib", rep.AnonKiB)
	if rep.Err != "" {
		return rep, errors.New(rep.Err)
	}
	return rep, err
}

func (r *procRuntime) Start(ctx context.Context) (pyruntime.Info, error) { return r.syn.Start(ctx) }
func (r *procRuntime) Init(ctx context.Context, seed int64, out string) error {
	_, err := r.call(ctx, workerJob{Op: "init", Seed: seed, Out: out})
	return err
}
func (r *procRuntime) Train(ctx context.Context, job pyruntime.TrainJob) (pyruntime.TrainResult, error) {
	rep, err := r.call(ctx, workerJob{Op: "train", Job: &job})
	return rep.Train, err
}
func (r *procRuntime) Evaluate(ctx context.Context, pack string) (map[string]float64, error) {
	rep, err := r.call(ctx, workerJob{Op: "evaluate", Pack: pack})
	return rep.Metrics, err
}
func (r *procRuntime) Status() pyruntime.Status { return r.syn.Status() }
func (r *procRuntime) ScratchDir() string       { return r.syn.ScratchDir() }
func (r *procRuntime) Close() error             { return r.syn.Close() }

var _ pyruntime.Runtime = (*procRuntime)(nil)

// runWorker does one workerJob read from stdin and writes a workerReply to stdout.
func runWorker() int {
	var j workerJob
	var rep workerReply
	err := func() error {
		b, err := io.ReadAll(bufio.NewReader(os.Stdin))
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &j); err != nil {
			return err
		}
		rt := synth.New(j.Scratch)
		rt.Pad = j.Pad
		ctx := context.Background()
		if _, err := rt.Start(ctx); err != nil {
			return err
		}
		switch j.Op {
		case "init":
			return rt.Init(ctx, j.Seed, j.Out)
		case "train":
			if j.Job == nil {
				return errors.New("train without a job")
			}
			rep.Train, err = rt.Train(ctx, *j.Job)
			return err
		case "evaluate":
			rep.Metrics, err = rt.Evaluate(ctx, j.Pack)
			return err
		}
		return fmt.Errorf("unknown op %q", j.Op)
	}()
	rep.PeakKiB, rep.AnonKiB = peakKiB(), statusKiB("RssAnon:")
	if err != nil {
		rep.Err = err.Error()
	}
	_ = json.NewEncoder(os.Stdout).Encode(rep)
	if err != nil {
		return 1
	}
	return 0
}
