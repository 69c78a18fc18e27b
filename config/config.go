package config

import (
	"time"

	"gopkg.in/yaml.v3"

	"github.com/p2pnode/p2pnode/codecs"
)

// Config is one experiment as seen by one node.
type Config struct {
	Node       Node       `yaml:"node"`
	Experiment Experiment `yaml:"experiment"`
	Dataset    Dataset    `yaml:"dataset"`
	Workload   Workload   `yaml:"workload"`
	Protocol   Protocol   `yaml:"protocol"`
	Merge      Merge      `yaml:"merge"`
	Lease      Lease      `yaml:"lease"`
	Export     Export     `yaml:"export"`

	// Path is the file the config was read from ("" for a built-in config). Relative paths
	// in the config are resolved against its directory.
	Path string `yaml:"-"`
}

// Node is this process: where it keeps state and how it is reached.
type Node struct {
	StoreDir  string   `yaml:"store_dir"`
	Identity  string   `yaml:"identity"`
	Listen    []string `yaml:"listen"`
	Bootstrap []string `yaml:"bootstrap"`
	HTTP      string   `yaml:"http"`
	MDNS      bool     `yaml:"mdns"`
	DHT       bool     `yaml:"dht"`
	Relay     bool     `yaml:"relay"`
	// RelayLimit bounds one connection this node relays (as a relay server: node.relay or
	// a bootstrap node). libp2p's defaults (2 minutes, 128 KiB) cannot carry one update of
	// the lm small preset (43 MB fp32).
	RelayLimit RelayLimit `yaml:"relay_limit"`
	// Reachability is whether others can dial this node: auto (AutoNAT finds out), public
	// (a bootstrap or relay node with a public address), or private (behind NAT: this
	// node reserves a slot at its bootstrap peers' relays at once, so that peers it
	// cannot be dialled by reach it through them).
	Reachability string `yaml:"reachability"`
	PSK          string `yaml:"psk"`
	LogLevel     string `yaml:"log_level"`
	ChunkSize    int    `yaml:"chunk_size"`
	// StreamDeadline bounds how long a peer may take to send a request frame it has
	// started, on every /p2ptrain/* protocol.
	StreamDeadline time.Duration `yaml:"stream_deadline"`
	// KeepHeads (K) is how many of the newest canonical heads keep their parameters in
	// the artifact store; the outer state and the merged contributions are kept for the
	// tip only, and work no head names (a delta, a contribution not merged) until the next
	// head. The rest is deleted after each checkpoint. Heads (the chain's small records)
	// and the dataset are always kept.
	KeepHeads int `yaml:"keep_heads"`
	// Archive keeps every artifact forever (a validator that serves full history):
	// keep_heads then does not apply.
	Archive bool `yaml:"archive"`
}

// RelayLimit is how long a relayed connection may last and how many MiB it may carry in
// each direction before the relay closes it.
type RelayLimit struct {
	Duration time.Duration `yaml:"duration"`
	DataMiB  int64         `yaml:"data_mib"`
}

// MinKeepHeads is the smallest node.keep_heads: a trainer may still be encoding its delta
// against the previous head when the next one arrives.
const MinKeepHeads = 2

// node.reachability values.
const (
	ReachAuto    = "auto"
	ReachPublic  = "public"
	ReachPrivate = "private"
)

// Role names.
const (
	RoleTrainer   = "trainer"
	RoleValidator = "validator"
	RoleBootstrap = "bootstrap"
)

// Experiment names the swarm and this node's part in it.
type Experiment struct {
	Network    string   `yaml:"network"`
	ID         string   `yaml:"id"`
	Roles      []string `yaml:"roles"`
	Validators []string `yaml:"validators"`
	Quorum     int      `yaml:"quorum"`
	Rounds     int      `yaml:"rounds"`
	Seed       int64    `yaml:"seed"`
	EvalEvery  int      `yaml:"eval_every"`
}

// HasRole reports whether this node holds role r.
func (e Experiment) HasRole(r string) bool {
	for _, x := range e.Roles {
		if x == r {
			return true
		}
	}
	return false
}

// Dataset is where the training data comes from.
type Dataset struct {
	Root            string `yaml:"root"`
	Manifest        string `yaml:"manifest"`
	Prepare         bool   `yaml:"prepare"`
	MicroshardBytes int64  `yaml:"microshard_bytes"`
}

// MaxMicroshardsPerTrainer bounds lease.microshards_per_trainer: it is lease.MaxLeaseMicroshards,
// the most one lease may grant (config imports none of the node's packages; a node test
// checks that the two agree).
const MaxMicroshardsPerTrainer = 4096

// DefaultRounds is experiment.rounds when a config does not say: a finite run rather than
// one that trains, and fills the store, until interrupted (docs/design-notes.md, "Default
// rounds"). Set rounds: 0 to run until stopped.
const DefaultRounds = 100

// Training precisions (workload.precision).
const (
	PrecisionFP32 = "fp32"
	PrecisionBF16 = "bf16" // autocast to bfloat16 (CUDA with bf16 support, or CPU)
	PrecisionFP16 = "fp16" // autocast to float16 with a GradScaler (CUDA only)
)

// Backend names.
const (
	BackendWorker  = "worker"
	BackendCommand = "checkpoint_command"
)

// Workload is the Python side: what trains and how it is run.
type Workload struct {
	Interpreter string            `yaml:"interpreter"`
	Factory     string            `yaml:"factory"`
	Config      map[string]any    `yaml:"config"`
	PythonPath  []string          `yaml:"python_path"`
	Env         map[string]string `yaml:"env"`
	Include     []string          `yaml:"include"`
	Exclude     []string          `yaml:"exclude"`
	Device      string            `yaml:"device"`
	Precision   string            `yaml:"precision"`
	Threads     int               `yaml:"threads"`
	// Devices lists the GPUs the worker runs one rank on each (cuda:0, cuda:1, ...), or is
	// "all" (every GPU torch sees); Ranks is a number of ranks on the CPU. Either makes the
	// worker start its ranks with torch.distributed (docs/gpu.md); neither trains on Device.
	Devices Devices `yaml:"devices"`
	Ranks   int     `yaml:"ranks"`
	// Shard is ShardDDP (every rank holds the model) or ShardFSDP (FSDP2 over the ranks).
	Shard string `yaml:"shard"`
	// ActivationCheckpointing recomputes each of the workload's blocks in the backward pass
	// instead of keeping its activations.
	ActivationCheckpointing bool `yaml:"activation_checkpointing"`
	// RankTimeout is the ranks' collective timeout: a rank that stops for longer fails the
	// window, and the worker restarts its ranks.
	RankTimeout  time.Duration `yaml:"rank_timeout"`
	Backend      string        `yaml:"backend"`
	Command      Command       `yaml:"command"`
	CallTimeout  time.Duration `yaml:"call_timeout"`
	TrainTimeout time.Duration `yaml:"train_timeout"`
}

// How a multi-rank worker splits the model (workload.shard).
const (
	ShardDDP  = "ddp"  // every rank holds the whole model; gradients averaged every step
	ShardFSDP = "fsdp" // FSDP2: parameters, gradients and optimizer state split over the ranks
)

// DevicesAll is workload.devices' one-word form: every GPU torch sees.
const DevicesAll = "all"

// Devices is workload.devices: a list of GPUs, or DevicesAll (held as a list of that one
// word).
type Devices []string

// All reports whether the devices are DevicesAll.
func (d Devices) All() bool { return len(d) == 1 && d[0] == DevicesAll }

// UnmarshalYAML takes a list, or one word (all, or a single device).
func (d *Devices) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*d = nil
		if n.Value != "" {
			*d = Devices{n.Value}
		}
		return nil
	}
	var s []string
	if err := n.Decode(&s); err != nil {
		return err
	}
	*d = s
	return nil
}

// MarshalYAML writes DevicesAll as the word, a list as a list.
func (d Devices) MarshalYAML() (any, error) {
	if d.All() {
		return DevicesAll, nil
	}
	return []string(d), nil
}

// Command is the checkpoint-command backend: the user's own training script.
type Command struct {
	Program string            `yaml:"program"`
	Args    []string          `yaml:"args"`
	Env     map[string]string `yaml:"env"`
}

// Merge policy names.
const (
	PolicyDiLoCo = "diloco"
	PolicyEMA    = "ema"
)

// OverlapEager is protocol.overlap's one mode: trainers train their next window while
// the round closes.
const OverlapEager = "eager"

// Protocol is how rounds train and merge.
type Protocol struct {
	MergePolicy string `yaml:"merge_policy"`
	InnerSteps  int    `yaml:"inner_steps"`
	// SpeedProportional scales each trainer's inner steps and microshards to its measured
	// speed (a mixed fleet). Off (default), every trainer runs inner_steps on
	// lease.microshards_per_trainer, so timing noise never changes H or the weights.
	SpeedProportional bool `yaml:"speed_proportional"`
	// Codec is how a trainer encodes its pseudo-gradient (codecs.All).
	Codec       codecs.Codec `yaml:"codec"`
	Int8Block   int          `yaml:"int8_block"`
	SparseBlock int          `yaml:"sparse_block"`
	SparseTopK  int          `yaml:"sparse_topk"`
	// SparseWarmupRounds and SparseWarmupFactor are the sparse codec's top-k warm-up: the
	// windows of rounds 1..SparseWarmupRounds keep sparse_topk × SparseWarmupFactor values
	// per block in round 1, falling geometrically to sparse_topk (diloco.SparseWarmupTopK).
	// 0 rounds = none.
	SparseWarmupRounds int     `yaml:"sparse_warmup_rounds"`
	SparseWarmupFactor float64 `yaml:"sparse_warmup_factor"`
	// SparseFeedbackDecay is how much of a trainer's unsent remainder carries into its
	// next round with the sparse codec, in (0, 1]: 1 is plain error feedback, less lets
	// stale remainders fade (SparseLoCo's decayed error feedback).
	SparseFeedbackDecay float64 `yaml:"sparse_feedback_decay"`
	// Overlap is how a trainer's windows overlap the round's communication: "" (none: a
	// trainer waits for the next head and lease after publishing) or OverlapEager (a lease
	// reserves the trainer's next microshards, and it trains them from its guess at the
	// next head once the round's last update is out, moved onto that head when it comes:
	// lease.Lease.Next, docs/wan.md).
	Overlap string `yaml:"overlap"`
	DiLoCo  DiLoCo `yaml:"diloco"`
	EMA     EMA    `yaml:"ema"`
}

// DiLoCo is the outer optimizer.
type DiLoCo struct {
	// OuterLR is the outer step's learning rate. A file that leaves it out or writes 0 gets
	// the default for its codec, whatever its overlap (OuterLRFor): SparseOuterLR with
	// protocol.codec sparse, else DefaultOuterLR.
	OuterLR  float64 `yaml:"outer_lr"`
	Momentum float64 `yaml:"momentum"`
	Nesterov bool    `yaml:"nesterov"`
}

// The outer step's defaults, written only here: config's defaults, the demo and the tests
// read them. Nesterov momentum 0.5 at lr 1.0 rather than the DiLoCo paper's 0.9 at 0.7,
// which suits long inner loops on large language models, not the inner loops and models
// this project trains (docs/design-notes.md).
const (
	DefaultOuterLR       = 1.0
	DefaultOuterMomentum = 0.5
	DefaultNesterov      = true
	// SparseOuterLR is the sparse codec's default outer lr, larger than the dense one
	// because its merged update is smaller than the dense mean of the same round: each
	// trainer sends its top-k coordinates and keeps the rest in its error feedback, which
	// the decay discounts. A preset whose model learns worse with it sets its own
	// (docs/design-notes.md).
	SparseOuterLR = 1.5
)

// OuterLRFor is protocol.diloco.outer_lr's default for the protocol's codec: SparseOuterLR
// with the sparse codec, else DefaultOuterLR. Only the codec decides it.
func OuterLRFor(p Protocol) float64 {
	if p.Codec == codecs.Sparse {
		return SparseOuterLR
	}
	return DefaultOuterLR
}

// EMA is the exponential-moving-average merge: next = (1 − NewWeight)·current + NewWeight·mean,
// where mean is the trainers' merged models.
type EMA struct {
	NewWeight float64 `yaml:"new_weight"`
}

// Merge is how contributions are screened and aggregated.
type Merge struct {
	Aggregator    string  `yaml:"aggregator"`
	TrimFraction  float64 `yaml:"trim_fraction"`
	ClipNorm      float64 `yaml:"clip_norm"`
	Screen        Screen  `yaml:"screen"`
	QualityWeight bool    `yaml:"quality_weight"`
}

// Screen bounds what a contribution may look like before it is merged.
type Screen struct {
	MaxNorm      float64  `yaml:"max_norm"`
	MaxNormRatio float64  `yaml:"max_norm_ratio"`
	MinCosine    *float64 `yaml:"min_cosine"`
	// CosineTolerance calibrates the cosine bar from the screening history in the heads:
	// after a few rounds a contribution is rejected when its cosine is below the recent
	// accepted mean minus this many spreads. 0 keeps the fixed min_cosine bar.
	CosineTolerance float64 `yaml:"cosine_tolerance"`
	// Reference is whether the leader screens against its own reference update (a window
	// it trains on data it samples; validator/reference.go): ReferenceAuto (where the
	// validator runs a workload), ReferenceOn (required) or ReferenceOff.
	Reference string `yaml:"reference"`
}

// The values of merge.screen.reference.
const (
	ReferenceAuto = "auto"
	ReferenceOn   = "on"
	ReferenceOff  = "off"
)

// Lease is how data is handed out.
type Lease struct {
	MicroshardsPerTrainer int `yaml:"microshards_per_trainer"`
	// SamplesPerStep is the samples one inner step reads (the workload's batch size), so
	// that the leader can lease a window's worth: at least ceil(inner_steps ×
	// samples_per_step / examples per microshard) microshards a trainer, where the epoch
	// holds that many for every trainer (lease.WindowShare). 0 takes
	// workload.config.batch_size; with neither, leases are microshards_per_trainer.
	SamplesPerStep int           `yaml:"samples_per_step"`
	MinGroup       int           `yaml:"min_group"`
	RoundTimeout   time.Duration `yaml:"round_timeout"`
	// MinDeadline is the least time an attempt's leases get: the deadline adapts to the
	// trainers' measured paces but never goes below this (nor above round_timeout).
	MinDeadline time.Duration `yaml:"min_deadline"`
	// FirstDeadline is an attempt's deadline while no pace of any leased trainer is known:
	// neither observed by this validator (its paces persist with its state) nor announced
	// by the trainer (its worker's probe, then its windows) — round 1 of a fresh experiment
	// with a workload that cannot probe. A trainer that stayed and let a lease expire gets
	// twice the deadline it missed next (from here or from its pace), always between
	// min_deadline and round_timeout. It replaces
	// round_timeout there, so a trainer lost in that attempt costs seconds, not the whole
	// timeout.
	FirstDeadline    time.Duration `yaml:"first_deadline"`
	QuarantineRounds int           `yaml:"quarantine_rounds"`
}

// Export keeps a plain model directory current while training runs.
type Export struct {
	Dir         string `yaml:"dir"`
	EveryRounds int    `yaml:"every_rounds"`
	InPlace     bool   `yaml:"in_place"`
	ShardBytes  int64  `yaml:"shard_bytes"`
	BlockBytes  int    `yaml:"block_bytes"`
}
