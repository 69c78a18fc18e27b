package pyruntime

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/pack"
)

func startCommand(t *testing.T, opts Options) *Command {
	t.Helper()
	c, err := NewCommand(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Start(context.Background()); err != nil {
		t.Fatalf("start: %v", err)
	}
	return c
}

func TestCommandBackendRunsP2PTrainCommand(t *testing.T) {
	t.Parallel()
	shards := digitsDataset(t)
	opts, _ := baseOptions(t, digitsFactory, nil)
	opts.Backend = BackendCommand
	rt, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ctx := context.Background()
	if info, err := rt.Start(ctx); err != nil || info.Backend != BackendCommand {
		t.Fatalf("start: %+v %v", info, err)
	}
	dir := rt.ScratchDir()
	base := filepath.Join(dir, "base.safetensors")
	if err := rt.Init(ctx, 5, base); err != nil {
		t.Fatal(err)
	}
	job := TrainJob{Base: base, Shards: shards, Steps: 60, Seed: 3,
		OptOut: filepath.Join(dir, "opt.safetensors"), Out: filepath.Join(dir, "out.safetensors")}
	res, err := rt.Train(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if res.Steps != 60 || res.Samples == 0 || !(res.LossLast < res.LossFirst) {
		t.Fatalf("result %+v", res)
	}
	job2 := job
	job2.Base, job2.OptIn, job2.OptOut, job2.Out = job.Out, job.OptOut, filepath.Join(dir, "opt2.safetensors"), filepath.Join(dir, "out2.safetensors")
	if _, err := rt.Train(ctx, job2); err != nil {
		t.Fatal(err)
	}
	m, err := rt.Evaluate(ctx, job2.Out)
	if err != nil {
		t.Fatal(err)
	}
	if m["accuracy"] < 0.7 {
		t.Fatalf("metrics %v", m)
	}
	if st := rt.Status(); st.Calls != 4 || st.Failures != 0 || st.State != StateReady {
		t.Fatalf("status %+v", st)
	}
}

func TestCommandBackendBadFactory(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	opts, _ := baseOptions(t, "no_such_module_xyz:W", nil)
	c, err := NewCommand(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no_such_module_xyz") {
		t.Fatalf("got %v", err)
	}
}

// A user's script: reads the job manifest from {job_manifest}, copies the base pack to the
// output and writes a result manifest to the path in the environment.
const copyScript = `
import json, os, shutil, sys
job = json.load(open(sys.argv[1]))
assert os.environ["P2PTRAIN_JOB_MANIFEST"] == sys.argv[1]
assert os.environ["P2PTRAIN_RESULT_MANIFEST"] == sys.argv[2]
assert os.environ["EXTRA"] == "yes"
shutil.copy(job["base_pack"], job["output_pack"])
json.dump({"steps_completed": job["steps"] - int(os.environ.get("SHORT", "0")), "samples": 7, "loss": 0.5,
           "metrics": {"odd": "nan", "x": 1}}, open(sys.argv[2], "w"))
`

func writePack(t *testing.T, path string, vals []float32) {
	t.Helper()
	p, err := pack.New(pack.Layout{{Name: "w", Shape: []int64{int64(len(vals))}}}, vals, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteFile(path); err != nil {
		t.Fatal(err)
	}
}

func TestCommandBackendUserScript(t *testing.T) {
	t.Parallel()
	opts, _ := baseOptions(t, "", nil)
	opts.Command = CommandOptions{Program: testInterpreter(), Args: []string{"-c", copyScript, "{job_manifest}", "{result_manifest}"},
		Env: map[string]string{"EXTRA": "yes"}}
	c := startCommand(t, opts)
	dir := c.ScratchDir()
	base := filepath.Join(dir, "base.safetensors")
	writePack(t, base, []float32{1, 2, 3})
	res, err := c.Train(context.Background(), TrainJob{Base: base, Shards: []string{"s"}, Steps: 4, Out: filepath.Join(dir, "out.safetensors")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Steps != 4 || res.Samples != 7 || res.Loss != 0.5 || !math.IsNaN(res.Metrics["odd"]) || res.Metrics["x"] != 1 {
		t.Fatalf("result %+v", res)
	}

	// Non-finite output values are caught on the Go side.
	bad := filepath.Join(dir, "bad.safetensors")
	writePack(t, bad, []float32{1, float32(math.Inf(1)), 3})
	_, err = c.Train(context.Background(), TrainJob{Base: bad, Shards: []string{"s"}, Steps: 1, Out: filepath.Join(dir, "out2.safetensors")})
	if !errors.Is(err, ErrNonFinite) {
		t.Fatalf("want ErrNonFinite, got %v", err)
	}
}

func TestCommandBackendStepMismatch(t *testing.T) {
	t.Parallel()
	opts, _ := baseOptions(t, "", nil)
	opts.Command = CommandOptions{Program: testInterpreter(), Args: []string{"-c", copyScript, "{job_manifest}", "{result_manifest}"},
		Env: map[string]string{"EXTRA": "yes", "SHORT": "1"}}
	c := startCommand(t, opts)
	base := filepath.Join(c.ScratchDir(), "base.safetensors")
	writePack(t, base, []float32{1})
	_, err := c.Train(context.Background(), TrainJob{Base: base, Shards: []string{"s"}, Steps: 4, Out: filepath.Join(c.ScratchDir(), "o")})
	if !errors.Is(err, ErrCommandFailed) || !strings.Contains(err.Error(), "completed 3 steps, asked for 4") {
		t.Fatalf("got %v", err)
	}
}

func TestCommandBackendFailingCommand(t *testing.T) {
	t.Parallel()
	opts, _ := baseOptions(t, "", nil)
	opts.Command = CommandOptions{Program: "/bin/sh", Args: []string{"-c", "echo preparing; echo 'out of memory: boom' >&2; exit 7"}}
	c := startCommand(t, opts)
	_, err := c.Train(context.Background(), TrainJob{Shards: []string{"s"}, Steps: 1, Out: filepath.Join(c.ScratchDir(), "o")})
	if !errors.Is(err, ErrCommandFailed) || !strings.Contains(err.Error(), "exit status 7") || !strings.Contains(err.Error(), "out of memory: boom") {
		t.Fatalf("want a failure quoting stderr, got %v", err)
	}
	t.Logf("failing command error: %v", err)
	if st := c.Status(); st.Failures != 1 || !strings.Contains(st.LastError, "exit status 7") {
		t.Fatalf("status %+v", st)
	}
}

func TestCommandBackendErrorInResultManifest(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	opts, _ := baseOptions(t, faultyFactory, map[string]any{"fault": "nan"})
	opts.Backend = BackendCommand
	c := startCommand(t, opts)
	_, err := c.Train(context.Background(), TrainJob{Shards: []string{"s"}, Steps: 3, Out: filepath.Join(c.ScratchDir(), "o")})
	if !errors.Is(err, ErrCommandFailed) || !errors.Is(err, ErrNonFinite) {
		t.Fatalf("want ErrCommandFailed and ErrNonFinite, got %v", err)
	}
}

func TestCommandBackendTimeout(t *testing.T) {
	t.Parallel()
	opts, _ := baseOptions(t, "", nil)
	opts.Command = CommandOptions{Program: "/bin/sh", Args: []string{"-c", "echo sleeping >&2; sleep 30"}}
	opts.TrainTimeout = time.Second
	c := startCommand(t, opts)
	start := time.Now()
	_, err := c.Train(context.Background(), TrainJob{Shards: []string{"s"}, Steps: 1, Out: filepath.Join(c.ScratchDir(), "o")})
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "sleeping") {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %s", d)
	}
}

func TestCommandBackendMissingProgram(t *testing.T) {
	t.Parallel()
	opts, _ := baseOptions(t, "", nil)
	opts.Command = CommandOptions{Program: "/nonexistent/train.sh"}
	c, err := NewCommand(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "/nonexistent/train.sh") {
		t.Fatalf("got %v", err)
	}
}
