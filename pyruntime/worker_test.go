package pyruntime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/pack"
)

const (
	digitsFactory = "p2ptrain.workloads.digits:Digits"
	tinyFactory   = "p2ptrain.testing:Tiny"
	faultyFactory = "p2ptrain.testing:Faulty"
)

func TestWorkerDigitsTrainsAndEvaluates(t *testing.T) {
	t.Parallel()
	shards := digitsDataset(t)
	opts, _ := baseOptions(t, digitsFactory, nil)
	w, info := startWorker(t, opts)
	ctx := context.Background()

	if info.ProtocolVersion != 1 || info.Device != "cpu" || info.ParamCount != 26122 || info.PID == 0 {
		t.Fatalf("hello: %+v", info)
	}
	for _, c := range requiredCapabilities {
		if !slices.Contains(info.Capabilities, c) {
			t.Errorf("capability %q missing from %v", c, info.Capabilities)
		}
	}
	dir := w.ScratchDir()
	if !strings.HasPrefix(dir, "/dev/shm/") {
		t.Logf("scratch dir %s is not on /dev/shm", dir)
	}

	genesis := filepath.Join(dir, "genesis.safetensors")
	if err := w.Init(ctx, 7, genesis); err != nil {
		t.Fatal(err)
	}
	g, err := pack.Load(genesis)
	if err != nil {
		t.Fatal(err)
	}
	if g.Layout.Hash() != info.LayoutHash || g.Layout.Params() != info.ParamCount {
		t.Fatalf("genesis layout %s (%d params), hello said %s (%d)", g.Layout.Hash(), g.Layout.Params(), info.LayoutHash, info.ParamCount)
	}
	g.Close()

	before, err := w.Evaluate(ctx, genesis)
	if err != nil {
		t.Fatal(err)
	}
	job := TrainJob{Base: genesis, Shards: shards, Steps: 150, Seed: 1,
		OptOut: filepath.Join(dir, "opt1.safetensors"), Out: filepath.Join(dir, "local1.safetensors")}
	res, err := w.Train(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if res.Steps != 150 || res.Samples < 150*20 || !(res.LossLast < res.LossFirst) || res.Seconds <= 0 {
		t.Fatalf("train result %+v", res)
	}
	after, err := w.Evaluate(ctx, job.Out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("held-out accuracy %.3f -> %.3f, loss %.3f -> %.3f (train loss %.3f -> %.3f)",
		before["accuracy"], after["accuracy"], before["loss"], after["loss"], res.LossFirst, res.LossLast)
	if after["accuracy"] < 0.85 || after["loss"] >= before["loss"] {
		t.Fatalf("training did not help: before %v after %v", before, after)
	}

	// Same inputs, same seed: the same bytes (the worker is stateless between calls).
	again := job
	again.Out, again.OptOut = filepath.Join(dir, "local1b.safetensors"), filepath.Join(dir, "opt1b.safetensors")
	if _, err := w.Train(ctx, again); err != nil {
		t.Fatal(err)
	}
	if !sameFile(t, job.Out, again.Out) || !sameFile(t, job.OptOut, again.OptOut) {
		t.Fatal("the same train job gave different bytes")
	}

	// The next round continues from the inner optimizer state.
	next := TrainJob{Base: job.Out, Shards: shards, Steps: 50, Seed: 2, OptIn: job.OptOut,
		OptOut: filepath.Join(dir, "opt2.safetensors"), Out: filepath.Join(dir, "local2.safetensors")}
	res2, err := w.Train(ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	if res2.LossFirst > res.LossFirst/2 {
		t.Fatalf("second round starts at loss %.3f, first started at %.3f", res2.LossFirst, res.LossFirst)
	}

	st := w.Status()
	if st.State != StateReady || st.PID != info.PID || st.Restarts != 0 || st.Calls != 6 || st.Failures != 0 {
		t.Fatalf("status %+v", st)
	}
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}

func TestWorkerProbe(t *testing.T) {
	t.Parallel()
	shards := digitsDataset(t)
	opts, _ := baseOptions(t, digitsFactory, nil)
	w, _ := startWorker(t, opts)
	r, err := w.Probe(context.Background(), shards, 5)
	if err != nil {
		t.Fatal(err)
	}
	if r.Device != "cpu" || r.SamplesPerSecond <= 0 || r.SecondsPerStep <= 0 || r.ParamCount != 26122 {
		t.Fatalf("probe %+v", r)
	}
}

func TestWorkerNonFiniteLoss(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	opts, _ := baseOptions(t, faultyFactory, map[string]any{"fault": "nan", "at_step": 2})
	w, info := startWorker(t, opts)
	ctx := context.Background()
	dir := w.ScratchDir()
	base := filepath.Join(dir, "base.safetensors")
	if err := w.Init(ctx, 1, base); err != nil {
		t.Fatal(err)
	}
	_, err := w.Train(ctx, TrainJob{Base: base, Shards: []string{"unused"}, Steps: 5, Out: filepath.Join(dir, "out.safetensors")})
	if !errors.Is(err, ErrNonFinite) {
		t.Fatalf("want ErrNonFinite, got %v", err)
	}
	var re *RemoteError
	if !errors.As(err, &re) || !strings.Contains(re.Message, "step 2") || re.Traceback == "" {
		t.Fatalf("remote error %#v", re)
	}
	if !strings.Contains(err.Error(), "train on worker") {
		t.Fatalf("error does not name the method and worker: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "out.safetensors")); !os.IsNotExist(err) {
		t.Fatalf("a non-finite run wrote its output: %v", err)
	}
	// An error raised in Python leaves the worker running.
	if _, err := w.Evaluate(ctx, base); err != nil {
		t.Fatal(err)
	}
	if st := w.Status(); st.PID != info.PID || st.Restarts != 0 || !strings.Contains(st.LastError, "NonFinite") {
		t.Fatalf("status %+v", st)
	}
}

func TestWorkerNonFiniteMetricsArrive(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	opts, _ := baseOptions(t, faultyFactory, map[string]any{"fault": "nan", "where": "evaluate"})
	w, _ := startWorker(t, opts)
	m, err := w.Evaluate(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if !math.IsNaN(m["mse"]) {
		t.Fatalf("metrics %v", m)
	}
}

func TestWorkerCrashMidCallRestarts(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	once := filepath.Join(t.TempDir(), "crashed")
	opts, _ := baseOptions(t, faultyFactory, map[string]any{"fault": "exit", "exit_code": 3, "once_file": once})
	w, info := startWorker(t, opts)
	ctx := context.Background()
	dir := w.ScratchDir()
	job := TrainJob{Shards: []string{"unused"}, Steps: 3, Out: filepath.Join(dir, "out.safetensors")}

	_, err := w.Train(ctx, job)
	if !errors.Is(err, ErrWorkerExited) {
		t.Fatalf("want ErrWorkerExited, got %v", err)
	}
	t.Logf("crash error: %v", err)
	msg := err.Error()
	for _, want := range []string{"train", fmt.Sprint(info.PID), "exit status 3", "exiting on purpose"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
	// The next call waits for the restarted worker and succeeds.
	if _, err := w.Train(ctx, job); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	st := w.Status()
	if st.Restarts != 1 || st.PID == info.PID || st.PID == 0 || st.State != StateReady {
		t.Fatalf("status after restart %+v (first pid %d)", st, info.PID)
	}
}

func TestWorkerHangTimesOutAndRestarts(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	once := filepath.Join(t.TempDir(), "hung")
	opts, _ := baseOptions(t, faultyFactory, map[string]any{"fault": "hang", "once_file": once})
	opts.TrainTimeout = 2 * time.Second
	w, info := startWorker(t, opts)
	ctx := context.Background()
	job := TrainJob{Shards: []string{"unused"}, Steps: 3, Out: filepath.Join(w.ScratchDir(), "out.safetensors")}

	start := time.Now()
	_, err := w.Train(ctx, job)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("want ErrTimeout, got %v", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("timeout took %s", d)
	}
	t.Logf("timeout error: %v", err)
	if !strings.Contains(err.Error(), "train on worker") || !strings.Contains(err.Error(), "hanging on purpose") {
		t.Fatalf("error does not name the method or show stderr: %v", err)
	}
	if _, err := w.Train(ctx, job); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if st := w.Status(); st.Restarts != 1 || st.PID == info.PID {
		t.Fatalf("status %+v", st)
	}
}

func TestWorkerContextDeadline(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	opts, _ := baseOptions(t, faultyFactory, map[string]any{"fault": "hang", "once_file": filepath.Join(t.TempDir(), "hung")})
	w, _ := startWorker(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	_, err := w.Train(ctx, TrainJob{Shards: []string{"x"}, Steps: 2, Out: filepath.Join(w.ScratchDir(), "o")})
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("want ErrTimeout from the context deadline, got %v", err)
	}
	if _, err := w.Evaluate(context.Background(), ""); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

func TestWorkerGivesUpAfterFailedRestarts(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	arm := filepath.Join(t.TempDir(), "arm")
	opts, _ := baseOptions(t, faultyFactory, map[string]any{"fault": "exit", "where": "construct", "arm_file": arm})
	opts.MaxRestarts = 2
	opts.TrainTimeout = 2 * time.Second
	w, _ := startWorker(t, opts)
	// From now on every new worker dies while building the workload.
	if err := os.WriteFile(arm, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := w.Train(ctx, TrainJob{Shards: []string{"x"}, Steps: 1 << 30, Out: filepath.Join(w.ScratchDir(), "o")})
	if err == nil {
		t.Fatal("an endless train returned")
	}
	deadline := time.Now().Add(time.Minute)
	for w.Status().State != StateFailed {
		if time.Now().After(deadline) {
			t.Fatalf("never gave up: %+v", w.Status())
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, err = w.Evaluate(context.Background(), "")
	if !errors.Is(err, ErrFailed) || !strings.Contains(err.Error(), "exiting on purpose") {
		t.Fatalf("want ErrFailed quoting the cause, got %v", err)
	}
}

func TestWorkerMissingInterpreter(t *testing.T) {
	t.Parallel()
	opts, _ := baseOptions(t, digitsFactory, nil)
	opts.Interpreter = "/nonexistent/bin/python3"
	w, err := NewWorker(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_, err = w.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/bin/python3") {
		t.Fatalf("want an error naming the interpreter, got %v", err)
	}
	t.Logf("missing interpreter error: %v", err)
	if st := w.Status(); st.State != StateFailed || st.LastError == "" {
		t.Fatalf("status %+v", st)
	}
}

func TestWorkerBadFactory(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	for _, factory := range []string{"no_such_module_xyz:Thing", "p2ptrain.testing:NoSuchClass"} {
		opts, _ := baseOptions(t, factory, nil)
		w, err := NewWorker(opts)
		if err != nil {
			t.Fatal(err)
		}
		_, err = w.Start(context.Background())
		w.Close()
		if !errors.Is(err, ErrWorkload) || !strings.Contains(err.Error(), factory) || !strings.Contains(err.Error(), testInterpreter()) {
			t.Fatalf("want a WorkloadError naming %s and the interpreter, got %v", factory, err)
		}
		t.Logf("bad factory error: %v", err)
	}
	if _, err := NewWorker(Options{Factory: "no-colon"}); err == nil {
		t.Fatal("a factory without module:attr was accepted")
	}
}

func TestWorkerWorkloadRaisesAtConstruction(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	opts, _ := baseOptions(t, faultyFactory, map[string]any{"fault": "raise", "where": "construct"})
	w, err := NewWorker(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_, err = w.Start(context.Background())
	var re *RemoteError
	if !errors.As(err, &re) || re.Type != "WorkloadError" || !strings.Contains(re.Traceback, "raising on purpose") {
		t.Fatalf("want a WorkloadError with the user's traceback, got %v", err)
	}
}

func TestWorkerRefusesUnknownProtocolVersion(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	opts, _ := baseOptions(t, tinyFactory, nil)
	opts.versions = []int{99}
	w, err := NewWorker(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_, err = w.Start(context.Background())
	if !errors.Is(err, ErrBadRequest) || !errors.Is(err, ErrProtocolMismatch) || !strings.Contains(err.Error(), "no common protocol version") {
		t.Fatalf("got %v", err)
	}
}

// A fake worker that answers hello with a version the node never offered.
func TestWorkerRejectsVersionItDidNotOffer(t *testing.T) {
	t.Parallel()
	requireNumpy(t)
	script := filepath.Join(t.TempDir(), "fake-python")
	fake := `#!/bin/sh
exec ` + testInterpreter() + ` -c '
import os, json, struct
req = os.read(3, 1 << 20)
rid = json.loads(req[4:])["id"]
body = json.dumps({"id": rid, "ok": True, "result": {"protocol_version": 7, "capabilities": []}}).encode()
os.write(4, struct.pack(">I", len(body)) + body)
os.read(3, 1 << 20)
'
`
	if err := os.WriteFile(script, []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	opts, _ := baseOptions(t, tinyFactory, nil)
	opts.Interpreter = script
	w, err := NewWorker(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_, err = w.Start(context.Background())
	if !errors.Is(err, ErrProtocolMismatch) || !strings.Contains(err.Error(), "protocol version 7") {
		t.Fatalf("got %v", err)
	}
}

func TestWorkerOutputIsForwardedNotParsed(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	opts, logs := baseOptions(t, faultyFactory, map[string]any{"fault": "print"})
	w, info := startWorker(t, opts)
	if _, err := w.Train(context.Background(), TrainJob{Shards: []string{"x"}, Steps: 2, Out: filepath.Join(w.ScratchDir(), "o")}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		l := logs.String()
		if strings.Contains(l, fmt.Sprintf("worker=%d", info.PID)) && strings.Contains(l, "a line on stdout") && strings.Contains(l, "a line on stderr") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker output not forwarded with worker=%d:\n%s", info.PID, l)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWorkerLayoutMismatch(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	opts, _ := baseOptions(t, tinyFactory, nil)
	w, info := startWorker(t, opts)
	other := filepath.Join(w.ScratchDir(), "other.safetensors")
	p, err := pack.New(pack.Layout{{Name: "w", Shape: []int64{3}}}, []float32{1, 2, 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteFile(other); err != nil {
		t.Fatal(err)
	}
	_, err = w.Load(context.Background(), other)
	if !errors.Is(err, ErrLayoutMismatch) || !strings.Contains(err.Error(), info.LayoutHash) || !strings.Contains(err.Error(), p.Layout.Hash()) {
		t.Fatalf("want LayoutMismatch naming both hashes, got %v", err)
	}
}

func TestWorkerLoadExportRoundTrip(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	opts, _ := baseOptions(t, tinyFactory, nil)
	w, _ := startWorker(t, opts)
	ctx := context.Background()
	dir := w.ScratchDir()
	a := filepath.Join(dir, "a.safetensors")
	if err := w.Init(ctx, 3, a); err != nil {
		t.Fatal(err)
	}
	p, err := pack.Load(a)
	if err != nil {
		t.Fatal(err)
	}
	vals := slices.Clone(p.Values)
	p.Close()
	for i := range vals {
		vals[i] = float32(i) * 0.5
	}
	q, _ := pack.New(p.Layout, vals, nil)
	b := filepath.Join(dir, "b.safetensors")
	if err := q.WriteFile(b); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Load(ctx, b); err != nil {
		t.Fatal(err)
	}
	c := filepath.Join(dir, "c.safetensors")
	if _, err := w.Export(ctx, c); err != nil {
		t.Fatal(err)
	}
	if !sameFile(t, b, c) {
		t.Fatal("Python's export of a Go pack is not byte-identical")
	}
}

func TestWorkerCloseInterruptsCall(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	opts, _ := baseOptions(t, tinyFactory, nil)
	w, err := NewWorker(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	dir := w.ScratchDir()
	errc := make(chan error, 1)
	go func() {
		_, err := w.Train(context.Background(), TrainJob{Shards: []string{"x"}, Steps: 1 << 30, Out: filepath.Join(dir, "o")})
		errc <- err
	}()
	// Close once the call is running.
	deadline := time.Now().Add(time.Minute)
	for w.Status().State != StateBusy {
		if time.Now().After(deadline) {
			t.Fatalf("the train call never started: %+v", w.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("want ErrClosed, got %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("close took %s", d)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("scratch dir %s survived Close", dir)
	}
	if st := w.Status(); st.State != StateClosed {
		t.Fatalf("status %+v", st)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	for _, o := range []Options{
		{Factory: "m:a", Backend: "carrier-pigeon"},
		{Factory: "m:a", Include: []string{" "}},
		{Factory: "m:a", Threads: -1},
		{Factory: ""},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
}
