package pyruntime

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Runtime is what the node needs from Python: a backend that builds, trains and evaluates
// the workload's model on parameter packs.
type Runtime interface {
	// Start spawns the worker and negotiates the protocol (worker), or checks that the
	// command can run (checkpoint command).
	Start(ctx context.Context) (Info, error)
	// Init writes a freshly initialised model (seeded) as a pack at out.
	Init(ctx context.Context, seed int64, out string) error
	// Train runs job.Steps inner steps from job.Base and writes job.Out (and job.OptOut).
	Train(ctx context.Context, job TrainJob) (TrainResult, error)
	// Evaluate loads a pack and returns the workload's held-out metrics.
	Evaluate(ctx context.Context, pack string) (map[string]float64, error)
	// Status is a snapshot for /status and logs.
	Status() Status
	// ScratchDir is where packs exchanged with Python should be written (tmpfs).
	ScratchDir() string
	// Close stops the worker (gracefully, then by force) and removes an owned scratch dir.
	Close() error
}

// New returns the backend chosen by opts.Backend.
func New(opts Options) (Runtime, error) {
	switch opts.Backend {
	case "", BackendWorker:
		return NewWorker(opts)
	case BackendCommand:
		return NewCommand(opts)
	}
	return nil, fmt.Errorf("pyruntime: unknown backend %q (want %q or %q)", opts.Backend, BackendWorker, BackendCommand)
}

// Info describes the running backend (from the worker's hello).
type Info struct {
	Backend         string   `json:"backend"`
	ProtocolVersion int      `json:"protocol_version,omitempty"`
	Capabilities    []string `json:"capabilities,omitempty"`
	Workload        string   `json:"workload,omitempty"`
	Python          string   `json:"python,omitempty"`
	Torch           string   `json:"torch,omitempty"`
	Device          string   `json:"device,omitempty"`
	// DeviceName and DeviceMemory (bytes) describe the device: the GPU's name and memory,
	// or the CPU model and the machine's RAM.
	DeviceName   string `json:"device_name,omitempty"`
	DeviceMemory int64  `json:"device_memory_bytes,omitempty"`
	// Precision is the training precision (fp32, bf16 or fp16).
	Precision string `json:"precision,omitempty"`
	// Ranks, Shard and Devices describe a worker that trains on several devices (Device is
	// then rank 0's); ActivationCheckpointing whether blocks are recomputed.
	Ranks                   int          `json:"ranks,omitempty"`
	Shard                   string       `json:"shard,omitempty"`
	ActivationCheckpointing bool         `json:"activation_checkpointing,omitempty"`
	Devices                 []RankDevice `json:"devices,omitempty"`
	LayoutHash              string       `json:"layout_hash,omitempty"`
	ParamCount              int64        `json:"param_count,omitempty"`
	PID                     int          `json:"pid,omitempty"`
	// P2PTrain says which p2ptrain package the worker runs: installed (version, path) or
	// the copy embedded in the node.
	P2PTrain string `json:"p2ptrain,omitempty"`
	// TokensPerSample is how many tokens one sample trains on, for workloads that count
	// tokens (a language model: its context); 0 otherwise.
	TokensPerSample int64 `json:"tokens_per_sample,omitempty"`
	// Warnings are what the worker found wrong at start-up without failing (an NVIDIA GPU
	// that torch cannot use), for the node to log.
	Warnings []string `json:"warnings,omitempty"`
}

// TrainJob is one inner loop: load Base, run Steps optimizer steps over batches from
// Shards (cycling), write the local parameters to Out and the inner-optimizer state to
// OptOut. OptIn is the state from the previous round ("" starts a fresh optimizer).
type TrainJob struct {
	Base   string
	Shards []string
	Steps  int
	Seed   int64
	OptIn  string
	OptOut string
	Out    string
	// Shift, when set, is where the node may later ask the running loop to move onto
	// another pack (WriteShift): before each step the runtime looks there, and once a
	// request has appeared it adds that pack minus Base to the model, keeping the progress
	// made, and reports it in TrainResult.ShiftedTo. A runtime without the capability
	// ignores it. Needs Base.
	Shift string
}

// TrainResult reports a finished inner loop.
type TrainResult struct {
	Steps     int     `json:"steps"`
	Samples   int64   `json:"samples"`
	Loss      float64 `json:"loss"`
	LossFirst float64 `json:"loss_first"`
	LossLast  float64 `json:"loss_last"`
	Seconds   float64 `json:"seconds"`
	// ShiftedTo is the pack a TrainJob.Shift request moved the model onto ("": none), and
	// ShiftedAt the index of the step it was applied before.
	ShiftedTo string `json:"shifted_to"`
	ShiftedAt int    `json:"shifted_at"`
	// Ranks reports each rank of a multi-device worker (Samples and Seconds are then the
	// node's: every rank's samples, the slowest rank's time); IdleRanks counts the ranks the
	// lease's batches left idle.
	Ranks     []RankDevice       `json:"ranks,omitempty"`
	IdleRanks int                `json:"idle_ranks,omitempty"`
	Metrics   map[string]float64 `json:"-"`
}

// ProbeResult is the worker's measured throughput.
type ProbeResult struct {
	Device           string  `json:"device"`
	SamplesPerSecond float64 `json:"samples_per_second"`
	// SecondsPerStep is the mean time of one inner step (the first, warm-up step left out).
	SecondsPerStep float64 `json:"seconds_per_step"`
	ParamCount     int64   `json:"param_count"`
}

// State of a runtime.
type State string

// States.
const (
	StateNew        State = "new"
	StateStarting   State = "starting"
	StateReady      State = "ready"
	StateBusy       State = "busy"
	StateRestarting State = "restarting"
	StateFailed     State = "failed"
	StateClosed     State = "closed"
)

// Status is a snapshot of a runtime's health.
type Status struct {
	Backend          string        `json:"backend"`
	State            State         `json:"state"`
	PID              int           `json:"pid,omitempty"`
	Restarts         int           `json:"restarts"`
	Device           string        `json:"device,omitempty"`
	DeviceName       string        `json:"device_name,omitempty"`
	DeviceMemory     int64         `json:"device_memory_bytes,omitempty"`
	Precision        string        `json:"precision,omitempty"`
	Calls            int64         `json:"calls"`
	Failures         int64         `json:"failures"`
	LastCall         string        `json:"last_call,omitempty"`
	LastCallAt       time.Time     `json:"last_call_at,omitzero"`
	LastCallDuration time.Duration `json:"last_call_duration,omitempty"`
	LastError        string        `json:"last_error,omitempty"`
	LastErrorAt      time.Time     `json:"last_error_at,omitzero"`
	// Ranks, Devices and RankRestarts: a worker on several devices (Options.Devices,
	// Options.Ranks): each rank's device, pid and memory, and how often the ranks were
	// restarted after one died or hung.
	Ranks        int          `json:"ranks,omitempty"`
	Devices      []RankDevice `json:"devices,omitempty"`
	RankRestarts int          `json:"rank_restarts,omitempty"`
	// TokensPerSample is the workload's (Info.TokensPerSample).
	TokensPerSample int64 `json:"tokens_per_sample,omitempty"`
}

// metrics decodes {name: number | "nan" | "inf" | "-inf"} (JSON has no NaN).
type metrics map[string]float64

func (m *metrics) UnmarshalJSON(b []byte) error {
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	out := make(metrics, len(raw))
	for k, v := range raw {
		switch x := v.(type) {
		case float64:
			out[k] = x
		case string:
			switch x {
			case "nan", "NaN":
				out[k] = math.NaN()
			case "inf", "Infinity":
				out[k] = math.Inf(1)
			case "-inf", "-Infinity":
				out[k] = math.Inf(-1)
			default:
				return fmt.Errorf("metric %q: %q is not a number", k, x)
			}
		default:
			return fmt.Errorf("metric %q: %v is not a number", k, v)
		}
	}
	*m = out
	return nil
}

// trainResultJSON is the wire shape of a train result (worker) and of a train result
// manifest (command: steps_completed instead of steps).
type trainResultJSON struct {
	TrainResult
	StepsCompleted *int    `json:"steps_completed"`
	Metrics        metrics `json:"metrics"`
}

func (r trainResultJSON) result() TrainResult {
	out := r.TrainResult
	if r.StepsCompleted != nil {
		out.Steps = *r.StepsCompleted
	}
	out.Metrics = map[string]float64(r.Metrics)
	if out.Metrics == nil {
		out.Metrics = map[string]float64{}
	}
	return out
}

func checkTrainJob(job TrainJob) error {
	switch {
	case job.Out == "":
		return fmt.Errorf("%w: TrainJob.Out is empty", ErrBadRequest)
	case job.Steps < 0:
		return fmt.Errorf("%w: TrainJob.Steps is %d", ErrBadRequest, job.Steps)
	case job.Steps > 0 && len(job.Shards) == 0:
		return fmt.Errorf("%w: TrainJob.Shards is empty", ErrBadRequest)
	case job.Shift != "" && job.Base == "":
		return fmt.Errorf("%w: TrainJob.Shift needs a Base", ErrBadRequest)
	}
	return nil
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}
