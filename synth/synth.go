// Package synth owns the synthetic workload that protocol tests and cmd/benchscale train
// instead of Python. It is linear regression y = W·x + b toward a fixed hidden teacher,
// trained by SGD, and implements pyruntime.Runtime, so clusters of nodes can train real (if
// tiny) models with real parameter packs, deltas and merges, fast and deterministically,
// without Python. It is test support, not a production workload: nothing under node/ or
// round/ imports it outside their tests.
//
// A shard file's bytes seed the examples drawn from it, so the data a trainer sees depends
// only on the microshards it was leased.
package synth

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/p2pnode/p2pnode/pack"
	"github.com/p2pnode/p2pnode/pyruntime"
)

// Model dimensions.
const (
	In  = 64
	Out = 8
)

// stepSeconds is the modelled cost of one synthetic step.
const stepSeconds = 0.001

// ExamplesPerShard is how many examples one shard file yields.
const ExamplesPerShard = 32

// Runtime is the synthetic workload. The zero value is not usable; call New.
type Runtime struct {
	scratch string
	// LR is the SGD step size (default 0.05).
	LR float32
	// Hook, when set, runs at the start of every Train (tests inject faults with it).
	Hook func(job pyruntime.TrainJob) error
	// Delay is added to every Train (to model slow trainers).
	Delay time.Duration
	// StepSeconds is the modelled cost of one step, reported as the window's training time
	// (default 1 ms). A trainer with half the step time measures twice the capacity, so a
	// mixed fleet is modelled without anyone sleeping.
	StepSeconds float64
	// EvalHook, when set, rewrites every Evaluate's metrics (tests model a model gone
	// wrong, whose held-out loss is NaN).
	EvalHook func(metrics map[string]float64) map[string]float64
	// Pad adds a tensor of this many parameters that training leaves as initialised: it
	// gives packs, deltas and outer state a chosen size (disk and transfer tests) without
	// changing what is learnt. Set it before Start; every node of a swarm needs the same.
	Pad int

	mu     sync.Mutex
	status pyruntime.Status
	calls  atomic.Int64
}

// New returns a synthetic runtime writing packs under scratch.
func New(scratch string) *Runtime {
	return &Runtime{scratch: scratch, LR: 0.05, status: pyruntime.Status{Backend: "synthetic", State: pyruntime.StateNew}}
}

// Layout is the synthetic model's pack layout.
func Layout() pack.Layout { return PaddedLayout(0) }

// PaddedLayout is the layout of a runtime with Pad = pad.
func PaddedLayout(pad int) pack.Layout {
	l := pack.Layout{{Name: "linear.bias", Shape: []int64{Out}}, {Name: "linear.weight", Shape: []int64{Out, In}}}
	if pad > 0 {
		l = append(l, pack.Entry{Name: "pad", Shape: []int64{int64(pad)}})
	}
	return l
}

func (r *Runtime) layout() pack.Layout { return PaddedLayout(r.Pad) }

func (r *Runtime) setState(s pyruntime.State, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status.State = s
	r.status.Calls = r.calls.Load()
	if err != nil {
		r.status.LastError, r.status.LastErrorAt = err.Error(), time.Now()
	}
}

// Start implements pyruntime.Runtime.
func (r *Runtime) Start(context.Context) (pyruntime.Info, error) {
	if err := os.MkdirAll(r.scratch, 0o755); err != nil {
		return pyruntime.Info{}, err
	}
	r.setState(pyruntime.StateReady, nil)
	return pyruntime.Info{Backend: "synthetic", Workload: "synth", Device: "cpu", LayoutHash: r.layout().Hash(), ParamCount: r.layout().Params()}, nil
}

// Init implements pyruntime.Runtime: small random weights from seed.
func (r *Runtime) Init(_ context.Context, seed int64, out string) error {
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	vals := make([]float32, r.layout().Params())
	for i := range vals {
		vals[i] = float32(rng.NormFloat64() * 0.1)
	}
	p, err := pack.New(r.layout(), vals, nil)
	if err != nil {
		return err
	}
	return p.WriteFile(out)
}

// teacher is the hidden model every shard's labels come from.
func teacher() (w [Out][In]float32, b [Out]float32) {
	rng := rand.New(rand.NewPCG(42, 42))
	for o := range Out {
		for i := range In {
			w[o][i] = float32(rng.NormFloat64())
		}
		b[o] = float32(rng.NormFloat64())
	}
	return
}

// examples draws a shard's examples from its bytes.
func examples(content []byte) (xs [][In]float32, ys [][Out]float32) {
	sum := sha256.Sum256(content)
	rng := rand.New(rand.NewPCG(binary.LittleEndian.Uint64(sum[:8]), binary.LittleEndian.Uint64(sum[8:16])))
	tw, tb := teacher()
	for range ExamplesPerShard {
		var x [In]float32
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		var y [Out]float32
		for o := range Out {
			s := tb[o]
			for i := range In {
				s += tw[o][i] * x[i]
			}
			y[o] = s + float32(rng.NormFloat64()*0.01)
		}
		xs, ys = append(xs, x), append(ys, y)
	}
	return xs, ys
}

// Train implements pyruntime.Runtime: Steps SGD steps (batch 8) cycling over the shards'
// examples.
func (r *Runtime) Train(ctx context.Context, job pyruntime.TrainJob) (pyruntime.TrainResult, error) {
	r.calls.Add(1)
	r.setState(pyruntime.StateBusy, nil)
	start := time.Now()
	res, err := r.train(ctx, job)
	if err != nil {
		r.setState(pyruntime.StateReady, err)
		return res, err
	}
	// Report the modelled time of the window (Delay plus a fixed cost per step), not the
	// wall time: on a loaded test machine wall times scatter, and trainers would look like
	// a mixed fleet. Real workers report what they measure.
	step := r.StepSeconds
	if step <= 0 {
		step = stepSeconds
	}
	res.Seconds = r.Delay.Seconds() + float64(job.Steps)*step
	_ = start
	r.setState(pyruntime.StateReady, nil)
	return res, nil
}

func (r *Runtime) train(ctx context.Context, job pyruntime.TrainJob) (pyruntime.TrainResult, error) {
	if r.Hook != nil {
		if err := r.Hook(job); err != nil {
			return pyruntime.TrainResult{}, err
		}
	}
	// The delay is spread over the steps (all of it before the loop when there are none),
	// so that a shift request (TrainJob.Shift) can come mid-window as with a real worker.
	pause := r.Delay
	if job.Steps > 0 {
		pause /= time.Duration(job.Steps)
	} else if err := sleep(ctx, pause); err != nil {
		return pyruntime.TrainResult{}, err
	}
	base, err := pack.Load(job.Base)
	if err != nil {
		return pyruntime.TrainResult{}, err
	}
	defer base.Close()
	if err := base.CheckLayout(r.layout()); err != nil {
		return pyruntime.TrainResult{}, err
	}
	w := append([]float32(nil), base.Values...)
	var xs [][In]float32
	var ys [][Out]float32
	for _, s := range job.Shards {
		b, err := os.ReadFile(s)
		if err != nil {
			return pyruntime.TrainResult{}, fmt.Errorf("synthetic train: %w", err)
		}
		x, y := examples(b)
		xs, ys = append(xs, x...), append(ys, y...)
	}
	if len(xs) == 0 {
		return pyruntime.TrainResult{}, errors.New("synthetic train: no examples")
	}
	const batch = 8
	res := pyruntime.TrainResult{Steps: job.Steps}
	pos := int(uint64(job.Seed) % uint64(len(xs)))
	var total float64
	for step := 0; step < job.Steps; step++ {
		if err := sleep(ctx, pause); err != nil {
			return res, err
		}
		if job.Shift != "" && res.ShiftedTo == "" {
			if err := shift(w, base, job.Shift, &res, step); err != nil {
				return res, err
			}
		}
		var grad [Out + Out*In]float32
		var loss float64
		for k := 0; k < batch; k++ {
			x, y := xs[pos%len(xs)], ys[pos%len(xs)]
			pos++
			for o := range Out {
				pred := w[o]
				for i := range In {
					pred += w[Out+o*In+i] * x[i]
				}
				e := pred - y[o]
				loss += float64(e * e)
				grad[o] += 2 * e / batch
				for i := range In {
					grad[Out+o*In+i] += 2 * e * x[i] / batch
				}
			}
		}
		for i := range grad {
			w[i] -= r.LR * grad[i]
		}
		loss /= batch
		if step == 0 {
			res.LossFirst = loss
		}
		res.LossLast = loss
		total += loss
		res.Samples += batch
	}
	res.Loss = total / float64(max(job.Steps, 1))
	p, err := pack.New(r.layout(), w, nil)
	if err != nil {
		return res, err
	}
	if err := p.WriteFile(job.Out); err != nil {
		return res, err
	}
	// The synthetic model has no optimizer state; write an empty state file so that the
	// node's bookkeeping is exercised as with a real worker.
	if job.OptOut != "" {
		if err := os.WriteFile(job.OptOut, []byte("synthetic-sgd\n"), 0o644); err != nil {
			return res, err
		}
	}
	return res, nil
}

// sleep waits d, or fails when ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("synthetic train: %w", err)
	}
	if d <= 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("synthetic train: %w", ctx.Err())
	case <-time.After(d):
		return nil
	}
}

// shift applies a shift request at path, if one has come, before step: w += to − base.
func shift(w []float32, base *pack.Pack, path string, res *pyruntime.TrainResult, step int) error {
	to, err := pyruntime.TakeShift(path)
	if err != nil || to == "" {
		return err
	}
	p, err := pack.Load(to)
	if err != nil {
		return fmt.Errorf("synthetic train: shift: %w", err)
	}
	defer p.Close()
	if err := p.CheckLayout(base.Layout); err != nil {
		return fmt.Errorf("synthetic train: shift: %w", err)
	}
	for i := range w {
		w[i] += p.Values[i] - base.Values[i]
	}
	res.ShiftedTo, res.ShiftedAt = to, step
	return nil
}

// Evaluate implements pyruntime.Runtime: mean squared error against the teacher on a fixed
// held-out set.
func (r *Runtime) Evaluate(_ context.Context, path string) (map[string]float64, error) {
	p, err := pack.Load(path)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	if err := p.CheckLayout(r.layout()); err != nil {
		return nil, err
	}
	xs, ys := examples([]byte("held-out"))
	var mse float64
	for k := range xs {
		for o := range Out {
			pred := p.Values[o]
			for i := range In {
				pred += p.Values[Out+o*In+i] * xs[k][i]
			}
			d := float64(pred - ys[k][o])
			mse += d * d
		}
	}
	mse /= float64(len(xs) * Out)
	m := map[string]float64{"mse": mse, "rmse": math.Sqrt(mse)}
	if r.EvalHook != nil {
		m = r.EvalHook(m)
	}
	return m, nil
}

// Status implements pyruntime.Runtime.
func (r *Runtime) Status() pyruntime.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.status
	s.Calls = r.calls.Load()
	return s
}

// ScratchDir implements pyruntime.Runtime.
func (r *Runtime) ScratchDir() string { return r.scratch }

// Close implements pyruntime.Runtime.
func (r *Runtime) Close() error {
	r.setState(pyruntime.StateClosed, nil)
	return nil
}

// WriteDataset writes n shard files of distinct random bytes into dir (for dataset.Build).
func WriteDataset(dir string, n int, seed uint64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := range n {
		b := make([]byte, 256)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("shard-%04d.bin", i)), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

var _ pyruntime.Runtime = (*Runtime)(nil)
