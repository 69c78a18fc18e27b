package pyruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/p2pnode/p2pnode/pack"
)

// Command is the checkpoint-command backend: every Init/Train/Evaluate runs the user's
// program once with a job manifest and reads its result manifest
// (docs/worker-protocol.md, "Checkpoint-command backend").
type Command struct {
	backend
	program string
	args    []string

	// guarded by mu
	jobSeq int
	pid    int
}

// jobManifest is the JSON the command reads.
type jobManifest struct {
	ProtocolVersion   int            `json:"protocol_version"`
	JobID             string         `json:"job_id"`
	Kind              string         `json:"kind"`
	BasePack          *string        `json:"base_pack"`
	OutputPack        *string        `json:"output_pack"`
	ShardPaths        []string       `json:"shard_paths"`
	Steps             int            `json:"steps"`
	Seed              int64          `json:"seed"`
	OptimizerStateIn  *string        `json:"optimizer_state_in"`
	OptimizerStateOut *string        `json:"optimizer_state_out"`
	Include           []string       `json:"include"`
	Exclude           []string       `json:"exclude"`
	Config            map[string]any `json:"config"`
	Device            string         `json:"device"`
	Precision         string         `json:"precision,omitempty"`
	Threads           int            `json:"threads"`
}

// NewCommand checks opts; nothing runs until Start.
func NewCommand(opts Options) (*Command, error) {
	opts.Backend = BackendCommand
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Command{backend: newBackend(o, o.Logger.With("backend", BackendCommand), "checkpoint command")}
	if o.Command.Program == "" {
		c.program = o.Interpreter
		c.args = []string{"-m", "p2ptrain.command", "--factory", o.Factory, "--job", "{job_manifest}", "--result", "{result_manifest}"}
	} else {
		c.program, c.args = o.Command.Program, o.Command.Args
	}
	return c, nil
}

// Start checks that the program can run: it must resolve to an executable, and with the
// default program the factory must import.
func (c *Command) Start(ctx context.Context) (Info, error) { return c.backend.start(ctx, c.start) }

func (c *Command) start(ctx context.Context) (Info, error) {
	if _, err := c.prepare(ctx); err != nil {
		return Info{}, err
	}
	path, err := exec.LookPath(c.program)
	if err != nil {
		return Info{}, fmt.Errorf("pyruntime: start checkpoint command: program %q: %w", c.program, err)
	}
	c.program = path
	info := Info{Backend: BackendCommand, ProtocolVersion: ProtocolVersion, Workload: c.opts.Factory}
	if c.opts.Command.Program == "" {
		args := []string{"-m", "p2ptrain.command", "--factory", c.opts.Factory, "--check"}
		if _, err := c.exec(ctx, "check", args, nil, c.opts.CallTimeout); err != nil {
			return Info{}, fmt.Errorf("pyruntime: start checkpoint command (interpreter %s, factory %s): %w", c.program, c.opts.Factory, err)
		}
	}
	c.log.Info("checkpoint command ready", "program", c.program, "args", c.args, "scratch", c.scratch)
	return info, nil
}

// Init runs an "init" job.
func (c *Command) Init(ctx context.Context, seed int64, out string) error {
	job := c.newJob("init")
	job.Seed, job.OutputPack = seed, &out
	if _, err := c.run(ctx, job, c.opts.CallTimeout); err != nil {
		return err
	}
	p, err := pack.Load(out)
	if err != nil {
		return fmt.Errorf("pyruntime: checkpoint command init (job %s): output pack: %w", job.JobID, err)
	}
	return p.Close()
}

// Train runs a "train" job and checks its output: exactly job.Steps steps, a pack with
// the base's layout and finite values.
func (c *Command) Train(ctx context.Context, tj TrainJob) (TrainResult, error) {
	if err := checkTrainJob(tj); err != nil {
		return TrainResult{}, fmt.Errorf("pyruntime: checkpoint command train: %w", err)
	}
	job := c.newJob("train")
	job.BasePack, job.OutputPack = optional(tj.Base), &tj.Out
	job.ShardPaths, job.Steps, job.Seed = nonNil(tj.Shards), tj.Steps, tj.Seed
	job.OptimizerStateIn, job.OptimizerStateOut = optional(tj.OptIn), optional(tj.OptOut)
	raw, err := c.run(ctx, job, c.opts.TrainTimeout)
	if err != nil {
		return TrainResult{}, err
	}
	fail := func(err error) (TrainResult, error) {
		err = fmt.Errorf("pyruntime: checkpoint command train (job %s): %w", job.JobID, err)
		c.noteErr(err)
		return TrainResult{}, err
	}
	var r trainResultJSON
	if err := json.Unmarshal(raw, &r); err != nil {
		return fail(fmt.Errorf("%w: result manifest: %v", ErrCommandFailed, err))
	}
	if r.StepsCompleted == nil {
		return fail(fmt.Errorf("%w: result manifest has no steps_completed", ErrCommandFailed))
	}
	res := r.result()
	if res.Steps != tj.Steps {
		return fail(fmt.Errorf("%w: completed %d steps, asked for %d", ErrCommandFailed, res.Steps, tj.Steps))
	}
	if err := checkOutputPack(tj.Out, tj.Base); err != nil {
		return fail(err)
	}
	return res, nil
}

// checkOutputPack verifies what a user's script wrote: a pack, with the base's layout,
// holding only finite values.
func checkOutputPack(out, base string) error {
	p, err := pack.Load(out)
	if err != nil {
		return fmt.Errorf("%w: output pack: %v", ErrCommandFailed, err)
	}
	defer p.Close()
	if base != "" {
		b, err := pack.Load(base)
		if err != nil {
			return fmt.Errorf("base pack: %w", err)
		}
		err = p.CheckLayout(b.Layout)
		b.Close()
		if err != nil {
			return fmt.Errorf("%w: output pack %s: %v", ErrLayoutMismatch, out, err)
		}
	}
	if name := p.Finite(); name != "" {
		return fmt.Errorf("%w: output pack %s: tensor %s holds NaN or Inf", ErrNonFinite, out, name)
	}
	return nil
}

// Evaluate runs an "evaluate" job on pack.
func (c *Command) Evaluate(ctx context.Context, packPath string) (map[string]float64, error) {
	job := c.newJob("evaluate")
	job.BasePack = &packPath
	raw, err := c.run(ctx, job, c.opts.TrainTimeout)
	if err != nil {
		return nil, err
	}
	var r struct {
		Metrics metrics `json:"metrics"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		err = fmt.Errorf("pyruntime: checkpoint command evaluate (job %s): %w: result manifest: %v", job.JobID, ErrCommandFailed, err)
		c.noteErr(err)
		return nil, err
	}
	if r.Metrics == nil {
		r.Metrics = metrics{}
	}
	return r.Metrics, nil
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (c *Command) newJob(kind string) *jobManifest {
	c.mu.Lock()
	c.jobSeq++
	seq := c.jobSeq
	c.mu.Unlock()
	return &jobManifest{
		ProtocolVersion: ProtocolVersion, JobID: fmt.Sprintf("%s-%06d", kind, seq), Kind: kind,
		ShardPaths: []string{}, Include: nonNil(c.opts.Include), Exclude: nonNil(c.opts.Exclude),
		Config: c.opts.Config, Device: c.opts.Device, Precision: c.opts.Precision, Threads: c.opts.Threads,
	}
}

// run writes the job manifest, runs the program and returns the result manifest's bytes.
func (c *Command) run(ctx context.Context, job *jobManifest, timeout time.Duration) (json.RawMessage, error) {
	what := fmt.Sprintf("checkpoint command %s (job %s)", job.Kind, job.JobID)
	c.mu.Lock()
	closed, started := c.closed, c.started
	c.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("pyruntime: %s: %w", what, ErrClosed)
	}
	if !started {
		return nil, fmt.Errorf("pyruntime: %s: %w", what, ErrNotStarted)
	}
	if err := c.acquire(ctx); err != nil {
		return nil, fmt.Errorf("pyruntime: %s: %w", what, err)
	}
	defer c.release()
	start := time.Now()
	raw, err := c.runLocked(ctx, job, timeout)
	if err != nil {
		err = fmt.Errorf("pyruntime: %s: %w", what, err)
		c.log.Warn("checkpoint command failed", "job", job.JobID, "err", err)
	}
	c.mu.Lock()
	c.recordCall(job.Kind, start, err)
	c.mu.Unlock()
	return raw, err
}

func (c *Command) runLocked(ctx context.Context, job *jobManifest, timeout time.Duration) (json.RawMessage, error) {
	dir := filepath.Join(c.scratch, "jobs", job.JobID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	jobPath, resultPath := filepath.Join(dir, "job.json"), filepath.Join(dir, "result.json")
	b, err := json.MarshalIndent(job, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(jobPath, b, 0o600); err != nil {
		return nil, err
	}
	args := make([]string, len(c.args))
	for i, a := range c.args {
		a = strings.ReplaceAll(a, "{job_manifest}", jobPath)
		args[i] = strings.ReplaceAll(a, "{result_manifest}", resultPath)
	}
	env := map[string]string{"P2PTRAIN_JOB_MANIFEST": jobPath, "P2PTRAIN_RESULT_MANIFEST": resultPath}
	raw, err := c.exec(ctx, job.Kind, args, env, timeout)
	if err == nil {
		os.RemoveAll(dir) // keep the manifests of failed jobs for inspection
	}
	return raw, err
}

// exec runs the program once and returns the result manifest (when env names one).
func (c *Command) exec(ctx context.Context, kind string, args []string, jobEnv map[string]string, timeout time.Duration) (json.RawMessage, error) {
	extra := map[string]string{}
	for k, v := range c.opts.Command.Env {
		extra[k] = v
	}
	for k, v := range jobEnv {
		extra[k] = v
	}
	ch, err := startChild(c.program, args, c.opts.pythonEnv(c.pkgDir, extra), nil, c.log)
	if err != nil {
		return nil, fmt.Errorf("%w: start %q: %v", ErrCommandFailed, c.program, err)
	}
	c.mu.Lock()
	c.pid, c.state = ch.pid, StateBusy
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.pid = 0
		if c.state == StateBusy {
			c.state = StateReady
		}
		c.mu.Unlock()
	}()
	start := time.Now()
	deadline := start.Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-ch.done:
	case <-timer.C:
		ch.killAndWait(5 * time.Second)
		return nil, fmt.Errorf("%w: %s %s did not finish within %s; killed; %s", ErrTimeout, c.program, kind, deadline.Sub(start).Round(time.Millisecond), formatTail(ch.stderrTail(8, 200*time.Millisecond)))
	case <-ctx.Done():
		ch.killAndWait(5 * time.Second)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("%w: %s %s passed the context deadline; killed; %s", ErrTimeout, c.program, kind, formatTail(ch.stderrTail(8, 200*time.Millisecond)))
		}
		return nil, fmt.Errorf("%s %s abandoned (%w); killed", c.program, kind, ctx.Err())
	case <-c.life.Done():
		ch.killAndWait(5 * time.Second)
		return nil, ErrClosed
	}
	tail := ch.stderrTail(8, time.Second)
	var raw json.RawMessage
	var readErr error
	if p := jobEnv["P2PTRAIN_RESULT_MANIFEST"]; p != "" {
		raw, readErr = readResult(p)
	}
	if ch.err != nil {
		var re struct {
			Error *RemoteError `json:"error"`
		}
		if readErr == nil && json.Unmarshal(raw, &re) == nil && re.Error != nil {
			return nil, fmt.Errorf("%w: %s %s exited with %s: %w; %s", ErrCommandFailed, c.program, kind, ch.exitString(), re.Error, formatTail(tail))
		}
		return nil, fmt.Errorf("%w: %s %s exited with %s; %s", ErrCommandFailed, c.program, kind, ch.exitString(), formatTail(tail))
	}
	if readErr != nil {
		return nil, fmt.Errorf("%w: %s %s exited 0 but left no readable result manifest: %v; %s", ErrCommandFailed, c.program, kind, readErr, formatTail(tail))
	}
	return raw, nil
}

func readResult(path string) (json.RawMessage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFrameSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFrameSize {
		return nil, fmt.Errorf("result manifest %s exceeds %d bytes", path, MaxFrameSize)
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("result manifest %s is not JSON", path)
	}
	return b, nil
}

func (c *Command) noteErr(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures++
	c.fail(err)
}

// Status is a snapshot of the backend's health.
func (c *Command) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Status{Backend: BackendCommand, State: c.state, PID: c.pid}
	c.fill(&s)
	return s
}

// Close kills a running command and removes an owned scratch directory.
func (c *Command) Close() error { return c.close(nil) }

var _ Runtime = (*Command)(nil)
