package pyruntime

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Backends.
const (
	BackendWorker  = "worker"
	BackendCommand = "checkpoint_command"
)

// Defaults for Options.
const (
	DefaultInterpreter  = "python3"
	DefaultCallTimeout  = 60 * time.Second
	DefaultTrainTimeout = 10 * time.Minute
	DefaultMaxRestarts  = 3
	DefaultRankTimeout  = 2 * time.Minute
	// DevicesAll in Options.Devices: every GPU torch sees.
	DevicesAll = "all"
)

// Options configure a Runtime. Zero values take the defaults noted on each field.
type Options struct {
	// Interpreter runs the worker (default "python3", looked up in PATH).
	Interpreter string
	// Factory is the workload, "module:attr" (required for the worker backend and for the
	// default checkpoint command).
	Factory string
	// Config is passed to the workload's constructor (workload.config).
	Config map[string]any
	// PythonPath entries are appended to PYTHONPATH after the p2ptrain package directory.
	PythonPath []string
	// Env adds or overrides environment variables of the Python processes.
	Env map[string]string
	// Include and Exclude are fnmatch globs over state-dict names choosing the pack's tensors.
	Include, Exclude []string
	// Device is "auto" (default: cuda when available), "cpu", "cuda", "cuda:1", ...
	Device string
	// Precision is "fp32" (default), "bf16" (autocast to bfloat16) or "fp16" (autocast to
	// float16 with a GradScaler; CUDA only).
	Precision string
	// Threads sets torch.set_num_threads and OMP_NUM_THREADS (0: torch's default; with
	// ranks on the CPU, the cores shared out among them); with ranks, per rank.
	Threads int
	// Devices lists the GPUs the worker starts one rank on each ("cuda:0", "cuda:1", ...,
	// or DevicesAll alone), Ranks a number of ranks on the CPU: the worker then trains with
	// torch.distributed (docs/gpu.md), and the node still sees one worker. Neither: the
	// worker trains on Device itself.
	Devices []string
	Ranks   int
	// Shard is "ddp" (default: every rank holds the model) or "fsdp" (FSDP2).
	Shard string
	// ActivationCheckpointing recomputes each of the workload's blocks in the backward pass.
	ActivationCheckpointing bool
	// RankTimeout is how long a rank may stop before the call fails and the ranks are
	// restarted (the collectives' timeout too; default 2m).
	RankTimeout time.Duration
	// Seed seeds the model the worker builds at hello (Init takes its own seed).
	Seed int64

	// CallTimeout is the deadline of hello, init, load, export (default 60s).
	CallTimeout time.Duration
	// TrainTimeout is the deadline of train, evaluate and probe (default 10m).
	TrainTimeout time.Duration

	// ScratchDir holds packs exchanged with Python. Default: a fresh /dev/shm/p2pnode-*
	// (os.TempDir when /dev/shm is missing), removed on Close. A given directory is kept.
	ScratchDir string
	// DiskScratchDir is where packs go instead when the scratch directory (a tmpfs, as a
	// rule) has less free space than the model's packs need (ScratchPacks × the fp32 model
	// bytes, checked once the worker has built the model): a fresh directory is made under
	// it and removed on Close, with one warning naming both sizes. Empty: no fallback, the
	// shortage is only logged. The node sets <store_dir>/scratch.
	DiskScratchDir string
	// PackageDir is a directory holding the p2ptrain package to use instead of the copy
	// embedded in the binary (for developing p2ptrain itself).
	PackageDir string

	// Backend is BackendWorker (default) or BackendCommand.
	Backend string
	// Command configures the checkpoint-command backend.
	Command CommandOptions

	// Logger receives the runtime's events and every line the Python processes print.
	Logger *slog.Logger
	// MaxRestarts is how many restarts in a row may fail before the runtime gives up
	// (default 3).
	MaxRestarts int

	// versions overrides the protocol versions offered at hello (tests only).
	versions []int
}

// CommandOptions configure the checkpoint-command backend. An empty Program runs
// "Interpreter -m p2ptrain.command --factory Factory" (the ready-made command).
// "{job_manifest}" and "{result_manifest}" in Args are replaced by the manifests' paths,
// which are also in $P2PTRAIN_JOB_MANIFEST and $P2PTRAIN_RESULT_MANIFEST.
type CommandOptions struct {
	Program string
	Args    []string
	Env     map[string]string
}

func (o Options) withDefaults() (Options, error) {
	o.Config = maps.Clone(o.Config)
	o.Env = maps.Clone(o.Env)
	o.Include, o.Exclude = slices.Clone(o.Include), slices.Clone(o.Exclude)
	if o.Interpreter == "" {
		o.Interpreter = DefaultInterpreter
	}
	if o.Device == "" {
		o.Device = "auto"
	}
	if o.Precision == "" {
		o.Precision = "fp32"
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.TrainTimeout == 0 {
		o.TrainTimeout = DefaultTrainTimeout
	}
	if o.MaxRestarts == 0 {
		o.MaxRestarts = DefaultMaxRestarts
	}
	if o.RankTimeout == 0 {
		o.RankTimeout = DefaultRankTimeout
	}
	if o.Shard == "" {
		o.Shard = "ddp"
	}
	o.Devices = slices.Clone(o.Devices)
	if o.Backend == "" {
		o.Backend = BackendWorker
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Config == nil {
		o.Config = map[string]any{}
	}
	if len(o.versions) == 0 {
		o.versions = []int{ProtocolVersion}
	}
	return o, o.validate()
}

func (o Options) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("pyruntime option %s: %s", field, fmt.Sprintf(format, args...)))
	}
	switch o.Backend {
	case BackendWorker, BackendCommand:
	default:
		bad("Backend", "unknown backend %q (want %q or %q)", o.Backend, BackendWorker, BackendCommand)
	}
	if o.Backend == BackendWorker || o.Command.Program == "" {
		if err := checkFactory(o.Factory); err != nil {
			bad("Factory", "%v", err)
		}
	}
	for _, g := range slices.Concat(o.Include, o.Exclude) {
		if strings.TrimSpace(g) == "" || strings.ContainsRune(g, 0) {
			bad("Include/Exclude", "glob %q must be non-empty and free of NUL bytes", g)
		}
	}
	if o.Threads < 0 {
		bad("Threads", "%d is negative", o.Threads)
	}
	if o.Ranks < 0 || o.RankTimeout < 0 {
		bad("Ranks/RankTimeout", "negative")
	}
	if o.Backend == BackendCommand && o.ranked() {
		bad("Devices/Ranks/ActivationCheckpointing", "the checkpoint-command backend runs the user's own script as it is; ranks and memory options need the worker backend")
	}
	if o.CallTimeout < 0 || o.TrainTimeout < 0 {
		bad("CallTimeout/TrainTimeout", "negative timeout")
	}
	if o.MaxRestarts < 0 {
		bad("MaxRestarts", "%d is negative", o.MaxRestarts)
	}
	for k, v := range o.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			bad("Env", "bad variable %q", k)
		}
	}
	for k, v := range o.Command.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			bad("Command.Env", "bad variable %q", k)
		}
	}
	for _, a := range o.Command.Args {
		if strings.ContainsRune(a, 0) {
			bad("Command.Args", "argument %q contains a NUL byte", a)
		}
	}
	return errors.Join(errs...)
}

func checkFactory(f string) error {
	mod, attr, ok := strings.Cut(f, ":")
	if !ok || strings.TrimSpace(mod) == "" || strings.TrimSpace(attr) == "" || strings.Contains(attr, ":") {
		return fmt.Errorf("%q must have the form module:attr", f)
	}
	return nil
}

// mallocEnv keeps glibc's malloc from handing every freed block of more than 32 MiB back
// to the kernel: PyTorch on CPU frees and allocates tensors of the model's size many
// times per step (AdamW's temporaries, the weight gradients), and each fresh mapping is
// faulted in again page by page, which on a VM with slow page faults can take most of a
// step (docs/design-notes.md). No mmap'd chunks, and no trimming of the heap's top below
// 64 GiB, so freed blocks are reused: the worker keeps its peak resident, which is what
// sizes a machine anyway. Settings the user's environment already makes win (glibc reads
// GLIBC_TUNABLES and the MALLOC_*_ variables).
func mallocEnv() []string {
	if os.Getenv("GLIBC_TUNABLES") != "" {
		return nil
	}
	var env []string
	for _, kv := range [][2]string{{"MALLOC_MMAP_MAX_", "0"}, {"MALLOC_TRIM_THRESHOLD_", "68719476736"}} {
		if _, set := os.LookupEnv(kv[0]); !set {
			env = append(env, kv[0]+"="+kv[1])
		}
	}
	return env
}

// pythonEnv is the environment of a Python process: ours, PYTHONPATH with the p2ptrain
// package first, thread settings, then Options.Env and extra (later entries win).
func (o Options) pythonEnv(pkgDir string, extra map[string]string) []string {
	env := os.Environ()
	var path []string
	if pkgDir != "" {
		path = append(path, pkgDir)
	}
	path = append(path, o.PythonPath...)
	if old := os.Getenv("PYTHONPATH"); old != "" {
		path = append(path, old)
	}
	env = append(env, "PYTHONPATH="+strings.Join(path, string(filepath.ListSeparator)), "PYTHONUNBUFFERED=1")
	if o.Threads > 0 {
		n := strconv.Itoa(o.Threads)
		env = append(env, "OMP_NUM_THREADS="+n, "MKL_NUM_THREADS="+n)
	}
	env = append(env, mallocEnv()...)
	for _, m := range []map[string]string{o.Env, extra} {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			env = append(env, k+"="+m[k])
		}
	}
	return env
}
