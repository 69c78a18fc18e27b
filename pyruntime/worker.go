package pyruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// requiredCapabilities are the methods the node relies on from a version-1 worker.
var requiredCapabilities = []string{"init", "load", "export", "train", "evaluate"}

// Worker is the long-lived Python worker backend (python -m p2ptrain.worker), supervised:
// one call at a time, a deadline on each, and a restart after a crash or a hang.
type Worker struct {
	backend
	src p2ptrainSource

	// guarded by mu
	proc           *workerProc
	info           Info
	restarting     bool
	restarts       int
	failedRestarts int
	gen            int // incremented for every worker process that passed hello
	loadedGen      int // gen of the process that last ran Load
	nextID         int64
	ranks          rankBook
}

type workerProc struct {
	*child
	reqW   *os.File // our end of the request pipe (the worker's fd 3)
	respR  *os.File // our end of the response pipe (the worker's fd 4)
	frames chan frameResult
	stop   chan struct{}
	once   sync.Once
}

type frameResult struct {
	b   []byte
	err error
}

type request struct {
	ID     int64  `json:"id"`
	Method string `json:"method"`
	Params any    `json:"params"`
}

type response struct {
	ID     *int64          `json:"id"`
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result"`
	Error  *RemoteError    `json:"error"`
}

type helloResult struct {
	ProtocolVersion         int          `json:"protocol_version"`
	Capabilities            []string     `json:"capabilities"`
	Workload                string       `json:"workload"`
	Python                  string       `json:"python"`
	Torch                   string       `json:"torch"`
	Device                  string       `json:"device"`
	DeviceName              string       `json:"device_name"`
	DeviceMemory            int64        `json:"device_memory_bytes"`
	Precision               string       `json:"precision"`
	LayoutHash              string       `json:"layout_hash"`
	ParamCount              int64        `json:"param_count"`
	TokensPerSample         int64        `json:"tokens_per_sample"`
	Ranks                   int          `json:"ranks"`
	Shard                   string       `json:"shard"`
	ActivationCheckpointing bool         `json:"activation_checkpointing"`
	Devices                 []RankDevice `json:"devices"`
}

// NewWorker checks opts; nothing runs until Start.
func NewWorker(opts Options) (*Worker, error) {
	opts.Backend = BackendWorker
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Worker{backend: newBackend(o, o.Logger.With("backend", BackendWorker, "factory", o.Factory), "worker")}, nil
}

// Start extracts the p2ptrain package, creates the scratch directory, spawns the worker
// and says hello. A missing interpreter, an unimportable factory or a protocol mismatch
// fail here with an error naming them; Start does not retry.
func (w *Worker) Start(ctx context.Context) (Info, error) { return w.backend.start(ctx, w.start) }

func (w *Worker) start(ctx context.Context) (Info, error) {
	var err error
	if w.src, err = w.prepare(ctx, w.opts.DiskScratchDir); err != nil {
		return Info{}, err
	}
	if err := w.acquire(ctx); err != nil {
		return Info{}, fmt.Errorf("pyruntime: start worker: %w", err)
	}
	defer w.release()
	p, info, err := w.spawn(ctx)
	if err != nil {
		return Info{}, err
	}
	if err := w.fitScratch(info.ParamCount); err != nil {
		p.shutdown()
		return Info{}, err
	}
	w.adopt(p, info, false)
	w.log.Info("python worker ready", "worker", info.PID, "python", info.Python, "torch", info.Torch,
		"device", info.Device, "device_name", info.DeviceName, "precision", info.Precision, "p2ptrain", info.P2PTrain, "params", info.ParamCount, "layout_hash", info.LayoutHash, "scratch", w.scratch,
		"activation_checkpointing", info.ActivationCheckpointing)
	if info.Ranks > 1 {
		w.log.Info("python worker ranks ready", "ranks", info.Ranks, "devices", rankDeviceNames(info.Devices), "shard", info.Shard)
	}
	return info, nil
}

// spawn starts a worker process and runs hello on it.
func (w *Worker) spawn(ctx context.Context) (*workerProc, Info, error) {
	o := w.opts
	what := fmt.Sprintf("start worker (interpreter %s, factory %s)", o.Interpreter, o.Factory)
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, Info{}, fmt.Errorf("pyruntime: %s: %w", what, err)
	}
	respR, respW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		return nil, Info{}, fmt.Errorf("pyruntime: %s: %w", what, err)
	}
	args := []string{"-u", "-m", "p2ptrain.worker", "--fd-in", "3", "--fd-out", "4"}
	c, err := startChild(o.Interpreter, args, o.pythonEnv(w.pkgDir, nil), []*os.File{reqR, respW}, w.log)
	reqR.Close()
	respW.Close()
	if err != nil {
		reqW.Close()
		respR.Close()
		return nil, Info{}, fmt.Errorf("pyruntime: %s: interpreter %q: %w", what, o.Interpreter, err)
	}
	p := &workerProc{child: c, reqW: reqW, respR: respR, frames: make(chan frameResult, 1), stop: make(chan struct{})}
	go p.readLoop()

	var hr helloResult
	params := map[string]any{
		"versions": o.versions, "factory": o.Factory, "config": o.Config,
		"include": nonNil(o.Include), "exclude": nonNil(o.Exclude),
		"device": o.Device, "precision": o.Precision, "threads": o.Threads, "seed": o.Seed,
	}
	o.rankParams(params)
	if _, err := w.roundTrip(ctx, p, "hello", params, &hr, o.CallTimeout); err != nil {
		p.shutdown()
		var re *RemoteError
		if errors.As(err, &re) && re.Type == "BadRequest" && strings.Contains(re.Message, "no common protocol version") {
			err = mismatchError(o, w.src, re)
		}
		return nil, Info{}, fmt.Errorf("pyruntime: %s: hello on worker %d: %w", what, c.pid, err)
	}
	if !slices.Contains(o.versions, hr.ProtocolVersion) {
		p.shutdown()
		return nil, Info{}, fmt.Errorf("pyruntime: %s: %w", what,
			mismatchError(o, w.src, fmt.Errorf("worker %d chose protocol version %d", c.pid, hr.ProtocolVersion)))
	}
	for _, capName := range slices.Concat(requiredCapabilities, o.rankCapabilities()) {
		if !slices.Contains(hr.Capabilities, capName) {
			p.shutdown()
			return nil, Info{}, fmt.Errorf("pyruntime: %s: %w: worker %d lacks capability %q (has %v)",
				what, ErrProtocol, c.pid, capName, hr.Capabilities)
		}
	}
	info := Info{
		Backend: BackendWorker, ProtocolVersion: hr.ProtocolVersion, Capabilities: hr.Capabilities,
		Workload: hr.Workload, Python: hr.Python, Torch: hr.Torch, Device: hr.Device,
		DeviceName: hr.DeviceName, DeviceMemory: hr.DeviceMemory, Precision: hr.Precision,
		LayoutHash: hr.LayoutHash, ParamCount: hr.ParamCount, TokensPerSample: hr.TokensPerSample, PID: c.pid, P2PTrain: w.src.String(),
		Ranks: hr.Ranks, Shard: hr.Shard, ActivationCheckpointing: hr.ActivationCheckpointing, Devices: hr.Devices,
	}
	return p, info, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (p *workerProc) readLoop() {
	for {
		b, err := readFrame(p.respR, MaxFrameSize)
		select {
		case p.frames <- frameResult{b, err}:
		case <-p.stop:
			return
		}
		if err != nil {
			return
		}
	}
}

// shutdown kills the process group and releases the pipes.
func (p *workerProc) shutdown() {
	p.once.Do(func() {
		p.killAndWait(5 * time.Second)
		close(p.stop)
		p.reqW.Close()
		p.respR.Close()
	})
}

// adopt makes p the current worker (caller holds the semaphore).
func (w *Worker) adopt(p *workerProc, info Info, restart bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.info.LayoutHash != "" && info.LayoutHash != w.info.LayoutHash {
		w.log.Warn("restarted worker has a different model layout", "was", w.info.LayoutHash, "now", info.LayoutHash)
	}
	w.proc, w.info = p, info
	w.ranks.started(info)
	w.gen++
	w.state = StateReady
	w.failedRestarts = 0
	if restart {
		w.restarts++
	}
}

// ensure returns the live worker, starting a new one if the last one died (caller holds
// the semaphore).
func (w *Worker) ensure(ctx context.Context) (*workerProc, error) {
	w.mu.Lock()
	p, state, closed, started, lastErr := w.proc, w.state, w.closed, w.started, w.lastErr
	w.mu.Unlock()
	switch {
	case closed:
		return nil, ErrClosed
	case !started:
		return nil, ErrNotStarted
	case p != nil:
		return p, nil
	case state == StateFailed:
		return nil, fmt.Errorf("%w after %d failed restarts: %v", ErrFailed, w.opts.MaxRestarts, lastErr)
	}
	return w.respawn(ctx)
}

// respawn makes one restart attempt (caller holds the semaphore).
func (w *Worker) respawn(ctx context.Context) (*workerProc, error) {
	w.mu.Lock()
	w.state = StateRestarting
	w.mu.Unlock()
	p, info, err := w.spawn(ctx)
	if err == nil {
		w.adopt(p, info, true)
		w.log.Info("python worker restarted", "worker", info.PID, "restarts", w.Status().Restarts)
		return p, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || ctx.Err() != nil || errors.Is(err, ErrClosed) {
		w.log.Debug("python worker not restarted: shutting down", "err", err)
		return nil, err
	}
	w.failedRestarts++
	w.fail(err)
	if w.failedRestarts >= w.opts.MaxRestarts {
		w.state = StateFailed
		w.log.Error("python worker keeps failing to start; giving up", "attempts", w.failedRestarts, "err", err)
		return nil, fmt.Errorf("%w after %d failed restarts: %v", ErrFailed, w.failedRestarts, err)
	}
	w.log.Warn("python worker restart failed", "attempt", w.failedRestarts, "err", err)
	return nil, err
}

// discard drops a worker that failed a call and restarts one in the background.
func (w *Worker) discard(p *workerProc) {
	p.shutdown()
	w.mu.Lock()
	if w.proc == p {
		w.proc = nil
	}
	if w.closed || w.restarting || w.state == StateFailed {
		w.mu.Unlock()
		return
	}
	w.state = StateRestarting
	w.restarting = true
	w.mu.Unlock()
	w.wg.Add(1)
	go w.restartLoop()
}

func (w *Worker) restartLoop() {
	defer w.wg.Done()
	defer func() {
		w.mu.Lock()
		w.restarting = false
		w.mu.Unlock()
	}()
	backoff := 100 * time.Millisecond
	for {
		if w.acquire(w.life) != nil {
			return
		}
		w.mu.Lock()
		need := w.proc == nil && !w.closed && w.state != StateFailed
		w.mu.Unlock()
		if !need {
			w.release()
			return
		}
		_, err := w.respawn(w.life)
		w.release()
		if err == nil || errors.Is(err, ErrFailed) {
			return
		}
		select {
		case <-time.After(backoff):
		case <-w.life.Done():
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// call runs one method on the worker: one at a time, with a deadline, restarting the
// worker when it dies or hangs.
func (w *Worker) call(ctx context.Context, method string, params, out any, timeout time.Duration) error {
	if err := w.acquire(ctx); err != nil {
		return fmt.Errorf("pyruntime: %s: %w", method, err)
	}
	defer w.release()
	p, err := w.ensure(ctx)
	if err != nil {
		err = fmt.Errorf("pyruntime: %s (factory %s): %w", method, w.opts.Factory, err)
		w.record(method, time.Now(), err)
		return err
	}
	w.mu.Lock()
	w.state = StateBusy
	w.mu.Unlock()
	start := time.Now()
	fatal, err := w.roundTrip(ctx, p, method, params, out, timeout)
	if err != nil {
		err = fmt.Errorf("pyruntime: %s on worker %d (factory %s): %w", method, p.pid, w.opts.Factory, err)
		var re *RemoteError
		if ctx.Err() != nil || w.life.Err() != nil {
			// The caller gave up or the runtime is closing (a node shutting down): expected,
			// and not worth a warning on every Ctrl-C.
			w.log.Debug("python call abandoned", "worker", p.pid, "method", method, "err", err)
		} else if errors.As(err, &re) && re.Traceback != "" {
			w.log.Warn("python call failed", "worker", p.pid, "method", method, "type", re.Type, "message", re.Message, "traceback", re.Traceback)
		} else {
			w.log.Warn("python call failed", "worker", p.pid, "method", method, "err", err)
		}
	}
	w.mu.Lock()
	if w.proc == p {
		w.state = StateReady
	}
	w.mu.Unlock()
	if fatal {
		w.discard(p)
	}
	w.record(method, start, err)
	return err
}

func (w *Worker) record(method string, start time.Time, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recordCall(method, start, err)
	w.ranks.failed(err)
}

// roundTrip sends one request and waits for its response. fatal reports that the worker
// can no longer be trusted (it exited, hung, or broke the protocol) and must be replaced.
func (w *Worker) roundTrip(ctx context.Context, p *workerProc, method string, params, out any, timeout time.Duration) (fatal bool, err error) {
	w.mu.Lock()
	w.nextID++
	id := w.nextID
	w.mu.Unlock()
	req, err := json.Marshal(request{ID: id, Method: method, Params: params})
	if err != nil {
		return false, fmt.Errorf("%w: encode request: %v", ErrBadRequest, err)
	}
	if len(req) > MaxFrameSize {
		return false, fmt.Errorf("%w: request of %d bytes exceeds the %d-byte frame limit", ErrBadRequest, len(req), MaxFrameSize)
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()

	_ = p.reqW.SetWriteDeadline(deadline)
	if err := writeFrame(p.reqW, req); err != nil {
		if p.exited() || errors.Is(err, os.ErrClosed) || isBrokenPipe(err) {
			return true, w.exitError(p)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return true, w.timeoutError(p, timeout, ctx)
		}
		return true, fmt.Errorf("%w: write request: %v", ErrProtocol, err)
	}

	done := p.done
	var grace <-chan time.Time
	for {
		select {
		case f := <-p.frames:
			return w.handleFrame(p, id, f, out)
		case <-done:
			// The process is gone; a response it wrote just before exiting may still be in
			// the pipe, so give the reader a moment.
			done = nil
			grace = time.After(200 * time.Millisecond)
		case <-grace:
			return true, w.exitError(p)
		case <-timer.C:
			return true, w.timeoutError(p, timeout, ctx)
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return true, w.timeoutError(p, timeout, ctx)
			}
			p.kill()
			return true, fmt.Errorf("call abandoned (%w); worker killed", ctx.Err())
		case <-w.life.Done():
			p.kill()
			return true, ErrClosed
		}
	}
}

func (w *Worker) handleFrame(p *workerProc, id int64, f frameResult, out any) (bool, error) {
	if f.err != nil {
		if errors.Is(f.err, io.EOF) || errors.Is(f.err, io.ErrUnexpectedEOF) || errors.Is(f.err, os.ErrClosed) {
			// The worker closed its end: it is exiting. Wait for its status.
			select {
			case <-p.done:
			case <-time.After(2 * time.Second):
				p.kill()
				<-p.done
			}
			return true, w.exitError(p)
		}
		return true, fmt.Errorf("%w: read response: %v", ErrProtocol, f.err)
	}
	var resp response
	if err := json.Unmarshal(f.b, &resp); err != nil {
		return true, fmt.Errorf("%w: response is not JSON: %v", ErrProtocol, err)
	}
	if resp.ID == nil || *resp.ID != id {
		if !resp.OK && resp.Error != nil {
			return true, fmt.Errorf("%w: response to request %d has id %v: %v", ErrProtocol, id, idString(resp.ID), resp.Error)
		}
		return true, fmt.Errorf("%w: response to request %d has id %v", ErrProtocol, id, idString(resp.ID))
	}
	if !resp.OK {
		if resp.Error == nil {
			return true, fmt.Errorf("%w: response %d has ok=false and no error", ErrProtocol, id)
		}
		return false, resp.Error
	}
	if out != nil {
		if err := json.Unmarshal(resp.Result, out); err != nil {
			return false, fmt.Errorf("%w: decode result: %v", ErrProtocol, err)
		}
	}
	return false, nil
}

func idString(id *int64) string {
	if id == nil {
		return "null"
	}
	return fmt.Sprint(*id)
}

func (w *Worker) exitError(p *workerProc) error {
	select {
	case <-p.done:
	case <-time.After(2 * time.Second):
	}
	return fmt.Errorf("%w during the call (%s); %s", ErrWorkerExited, p.exitString(), formatTail(p.stderrTail(8, 500*time.Millisecond)))
}

func (w *Worker) timeoutError(p *workerProc, timeout time.Duration, ctx context.Context) error {
	p.killAndWait(5 * time.Second)
	limit := fmt.Sprintf("the %s deadline", timeout)
	if d, ok := ctx.Deadline(); ok && ctx.Err() != nil {
		limit = fmt.Sprintf("the context deadline (%s)", d.Format(time.RFC3339))
	}
	return fmt.Errorf("%w: no response within %s; worker killed and restarting; %s", ErrTimeout, limit, formatTail(p.stderrTail(8, 200*time.Millisecond)))
}

// Init writes a freshly initialised model, seeded with seed, as a pack at out.
func (w *Worker) Init(ctx context.Context, seed int64, out string) error {
	return w.call(ctx, "init", map[string]any{"seed": seed, "out": out}, nil, w.opts.CallTimeout)
}

// Train runs an inner loop (see TrainJob).
func (w *Worker) Train(ctx context.Context, job TrainJob) (TrainResult, error) {
	if err := checkTrainJob(job); err != nil {
		return TrainResult{}, fmt.Errorf("pyruntime: train: %w", err)
	}
	params := map[string]any{
		"base": nullable(job.Base), "shards": nonNil(job.Shards), "steps": job.Steps, "seed": job.Seed,
		"opt_in": nullable(job.OptIn), "opt_out": nullable(job.OptOut), "out": job.Out,
	}
	if job.Shift != "" && w.require("train", "train_shift") == nil {
		params["shift"] = job.Shift
	}
	var r trainResultJSON
	if err := w.call(ctx, "train", params, &r, w.opts.TrainTimeout); err != nil {
		return TrainResult{}, err
	}
	res := r.result()
	w.mu.Lock()
	w.ranks.trained(res, w.log)
	w.mu.Unlock()
	if res.Steps != job.Steps {
		return res, fmt.Errorf("pyruntime: train (factory %s): %w: worker ran %d steps, asked for %d", w.opts.Factory, ErrProtocol, res.Steps, job.Steps)
	}
	if res.ShiftedTo != "" && params["shift"] == nil {
		return res, fmt.Errorf("pyruntime: train (factory %s): %w: worker reports a shift onto %s it was not asked for", w.opts.Factory, ErrProtocol, res.ShiftedTo)
	}
	return res, nil
}

// Evaluate loads pack into the model and returns the workload's held-out metrics.
func (w *Worker) Evaluate(ctx context.Context, pack string) (map[string]float64, error) {
	var r struct {
		Metrics metrics `json:"metrics"`
	}
	if err := w.call(ctx, "evaluate", map[string]any{"pack": nullable(pack)}, &r, w.opts.TrainTimeout); err != nil {
		return nil, err
	}
	if r.Metrics == nil {
		r.Metrics = metrics{}
	}
	return r.Metrics, nil
}

// require fails with ErrUnsupported when the worker did not advertise capability c.
func (w *Worker) require(method, c string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.info.PID != 0 && !slices.Contains(w.info.Capabilities, c) {
		return fmt.Errorf("pyruntime: %s (factory %s): %w: capability %q missing", method, w.opts.Factory, ErrUnsupported, c)
	}
	return nil
}

// Probe measures training throughput over a few steps on a throw-away copy of the model.
// Without shards it only reports the device and the parameter count.
func (w *Worker) Probe(ctx context.Context, shards []string, steps int) (ProbeResult, error) {
	var r ProbeResult
	if err := w.require("probe", "probe"); err != nil {
		return r, err
	}
	err := w.call(ctx, "probe", map[string]any{"shards": nonNil(shards), "steps": steps}, &r, w.opts.TrainTimeout)
	return r, err
}

// Load sets the worker's model parameters from a pack (checking its layout hash). The
// parameters live in the worker process: a restart loses them (Export then fails with
// ErrStateLost).
func (w *Worker) Load(ctx context.Context, pack string) (string, error) {
	var r struct {
		LayoutHash string `json:"layout_hash"`
	}
	if err := w.call(ctx, "load", map[string]any{"pack": pack}, &r, w.opts.CallTimeout); err != nil {
		return "", err
	}
	w.mu.Lock()
	w.loadedGen = w.gen
	w.mu.Unlock()
	return r.LayoutHash, nil
}

// Export writes the worker's current model parameters as a pack at out.
func (w *Worker) Export(ctx context.Context, out string) (string, error) {
	w.mu.Lock()
	lost := w.loadedGen != 0 && w.loadedGen != w.gen
	w.mu.Unlock()
	if lost {
		return "", fmt.Errorf("pyruntime: export (factory %s): %w", w.opts.Factory, ErrStateLost)
	}
	var r struct {
		LayoutHash string `json:"layout_hash"`
	}
	if err := w.call(ctx, "export", map[string]any{"out": out}, &r, w.opts.CallTimeout); err != nil {
		return "", err
	}
	return r.LayoutHash, nil
}

// Info is the last hello's result.
func (w *Worker) Info() Info {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.info
}

// fitScratch moves the scratch directory to Options.DiskScratchDir when the packs of the
// model the worker just built do not fit (see fitScratch in scratchspace.go).
func (w *Worker) fitScratch(params int64) error {
	c, err := fitScratch(w.scratch, params, w.opts.DiskScratchDir)
	if err != nil {
		return err
	}
	logScratch(w.log, w.scratch, c, w.opts.DiskScratchDir != "")
	if c.switched {
		if w.ownDir {
			_ = removeScratch(w.scratch)
		}
		w.scratch, w.ownDir = c.dir, c.own
	}
	return nil
}

// Status is a snapshot of the worker's health.
func (w *Worker) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := Status{Backend: BackendWorker, State: w.state, Restarts: w.restarts,
		Device: w.info.Device, DeviceName: w.info.DeviceName, DeviceMemory: w.info.DeviceMemory, Precision: w.info.Precision,
		TokensPerSample: w.info.TokensPerSample}
	w.fill(&s)
	w.ranks.fill(&s)
	if w.proc != nil {
		s.PID = w.proc.pid
	}
	return s
}

// Close asks the worker to shut down (killing it after a few seconds, or at once if a
// call is running) and removes the scratch directory if the runtime created it.
func (w *Worker) Close() error {
	return w.close(func() {
		w.mu.Lock()
		p := w.proc
		w.proc = nil
		w.mu.Unlock()
		if p == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = w.gracefulShutdown(ctx, p)
		cancel()
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
		}
		p.shutdown()
	})
}

// gracefulShutdown sends "shutdown" without the runtime's life context (already cancelled).
func (w *Worker) gracefulShutdown(ctx context.Context, p *workerProc) (bool, error) {
	req, _ := json.Marshal(request{ID: -1, Method: "shutdown", Params: map[string]any{}})
	_ = p.reqW.SetWriteDeadline(time.Now().Add(time.Second))
	if err := writeFrame(p.reqW, req); err != nil {
		return false, err
	}
	select {
	case <-p.frames:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

var _ Runtime = (*Worker)(nil)
