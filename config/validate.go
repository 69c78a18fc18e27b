package config

import (
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"

	"github.com/p2pnode/p2pnode/codecs"
)

// Validate checks every field and reports all problems at once, each naming its field path.
func (c *Config) Validate() error {
	v := &validator{}
	c.validateNode(v)
	c.validateExperiment(v)
	c.validateDataset(v)
	c.validateWorkload(v)
	c.validateProtocol(v)
	c.validateMerge(v)
	c.validateLease(v)
	c.validateExport(v)
	return v.err()
}

type validator struct{ problems []string }

func (v *validator) add(path, format string, args ...any) {
	v.problems = append(v.problems, path+": "+fmt.Sprintf(format, args...))
}

func (v *validator) check(ok bool, path, format string, args ...any) {
	if !ok {
		v.add(path, format, args...)
	}
}

func (v *validator) err() error {
	if len(v.problems) == 0 {
		return nil
	}
	if len(v.problems) == 1 {
		return fmt.Errorf("%w: %s", ErrInvalid, v.problems[0])
	}
	return fmt.Errorf("%w:\n  %s", ErrInvalid, strings.Join(v.problems, "\n  "))
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

func (c *Config) validateNode(v *validator) {
	n := c.Node
	v.check(n.StoreDir != "", "node.store_dir", "must not be empty")
	v.check(len(n.Listen) > 0, "node.listen", "needs at least one multiaddr")
	for i, a := range n.Listen {
		if _, err := multiaddr.NewMultiaddr(a); err != nil {
			v.add(fmt.Sprintf("node.listen[%d]", i), "%q is not a multiaddr: %v", a, err)
		}
	}
	for i, a := range n.Bootstrap {
		ma, err := multiaddr.NewMultiaddr(a)
		if err != nil {
			v.add(fmt.Sprintf("node.bootstrap[%d]", i), "%q is not a multiaddr: %v", a, err)
			continue
		}
		if _, err := ma.ValueForProtocol(multiaddr.P_P2P); err != nil {
			v.add(fmt.Sprintf("node.bootstrap[%d]", i), "%q must end in /p2p/<peer id>", a)
		}
	}
	if n.PSK != "" {
		if b, err := hex.DecodeString(strings.TrimSpace(n.PSK)); err != nil || len(b) != 32 {
			v.add("node.psk", "must be 64 hex characters (32 bytes; `openssl rand -hex 32` makes one), got %d characters", len(strings.TrimSpace(n.PSK)))
		}
		tcp := false
		for _, a := range n.Listen {
			if ma, err := multiaddr.NewMultiaddr(a); err == nil {
				if _, err := ma.ValueForProtocol(multiaddr.P_TCP); err == nil {
					tcp = true
				}
			}
		}
		v.check(tcp, "node.psk", "a private network runs over TCP only, but node.listen has no /tcp address")
	}
	if n.HTTP != "" && n.HTTP != "off" {
		v.check(strings.Contains(n.HTTP, ":"), "node.http", "must be host:port or \"off\", got %q", n.HTTP)
	}
	switch n.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		v.add("node.log_level", "must be debug, info, warn or error, got %q", n.LogLevel)
	}
	v.check(n.ChunkSize >= 1<<10 && n.ChunkSize <= 16<<20, "node.chunk_size", "must be between 1024 and 16777216, got %d", n.ChunkSize)
	v.check(n.StreamDeadline >= 100*time.Millisecond && n.StreamDeadline <= 10*time.Minute, "node.stream_deadline",
		"must be between 100ms and 10m, got %v", n.StreamDeadline)
	v.check(n.RelayLimit.Duration >= time.Second && n.RelayLimit.Duration <= 24*time.Hour, "node.relay_limit.duration",
		"must be between 1s and 24h, got %v", n.RelayLimit.Duration)
	v.check(n.RelayLimit.DataMiB >= 1 && n.RelayLimit.DataMiB <= 1<<16, "node.relay_limit.data_mib",
		"must be between 1 and 65536, got %d", n.RelayLimit.DataMiB)
	switch n.Reachability {
	case ReachAuto, ReachPublic, ReachPrivate:
	default:
		v.add("node.reachability", "must be auto, public or private, got %q", n.Reachability)
	}
	v.check(n.KeepHeads >= MinKeepHeads, "node.keep_heads",
		"must be at least %d (a trainer may still be encoding against the previous head; set node.archive: true to keep everything), got %d",
		MinKeepHeads, n.KeepHeads)
}

func (c *Config) validateExperiment(v *validator) {
	e := c.Experiment
	v.check(validID(e.Network), "experiment.network", "must be 1-64 characters of [a-zA-Z0-9._-], got %q", e.Network)
	v.check(validID(e.ID), "experiment.id", "must be 1-64 characters of [a-zA-Z0-9._-], got %q", e.ID)
	v.check(len(e.Roles) > 0, "experiment.roles", "needs at least one of trainer, validator, bootstrap")
	seen := map[string]bool{}
	for i, r := range e.Roles {
		switch r {
		case RoleTrainer, RoleValidator, RoleBootstrap:
		default:
			v.add(fmt.Sprintf("experiment.roles[%d]", i), "unknown role %q (want trainer, validator or bootstrap)", r)
		}
		v.check(!seen[r], fmt.Sprintf("experiment.roles[%d]", i), "role %q listed twice", r)
		seen[r] = true
	}
	for i, id := range e.Validators {
		if _, err := peer.Decode(id); err != nil {
			v.add(fmt.Sprintf("experiment.validators[%d]", i), "%q is not a peer id: %v", id, err)
		}
	}
	v.check(e.Quorum >= 1, "experiment.quorum", "must be >= 1, got %d", e.Quorum)
	if len(e.Validators) > 0 {
		v.check(e.Quorum <= len(e.Validators), "experiment.quorum", "%d exceeds the %d configured validators", e.Quorum, len(e.Validators))
		// Two disjoint groups of validators below a majority could each sign a different
		// head for the same round (a partition, or a leader taken over while heard).
		v.check(e.Quorum <= 0 || 2*e.Quorum > len(e.Validators), "experiment.quorum",
			"%d of %d validators is not a majority, so two heads could reach quorum for one round; use at least %d",
			e.Quorum, len(e.Validators), len(e.Validators)/2+1)
	} else {
		// Empty validators means this node alone signs heads: a quorum above 1 could never
		// be met, and the node would stall after genesis without a word.
		v.check(e.Quorum <= 1, "experiment.quorum", "%d needs experiment.validators to list at least %d peer ids "+
			"(an empty list means this node alone validates, with quorum 1)", e.Quorum, e.Quorum)
		// A trainer that is not a validator would trust only its own signature and so
		// accept no head from anyone.
		if c.Experiment.HasRole(RoleTrainer) && !c.Experiment.HasRole(RoleValidator) {
			v.add("experiment.validators", "a trainer without the validator role needs the validators' peer ids "+
				"(an empty list means this node alone validates)")
		}
	}
	v.check(e.EvalEvery >= 0, "experiment.eval_every", "must be >= 0 (0 = never), got %d", e.EvalEvery)
	v.check(e.Rounds >= 0, "experiment.rounds", "must be >= 0 (0 = no limit), got %d", e.Rounds)
}

func validID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

func (c *Config) validateDataset(v *validator) {
	d := c.Dataset
	if !c.Experiment.HasRole(RoleTrainer) && !c.Experiment.HasRole(RoleValidator) {
		return
	}
	v.check(d.Root != "", "dataset.root", "must not be empty")
	v.check(d.Manifest != "", "dataset.manifest", "must not be empty")
	v.check(d.MicroshardBytes > 0, "dataset.microshard_bytes", "must be > 0, got %d", d.MicroshardBytes)
}

func (c *Config) validateWorkload(v *validator) {
	w := c.Workload
	needsPython := c.Experiment.HasRole(RoleTrainer) || c.Experiment.HasRole(RoleValidator)
	if !needsPython {
		return
	}
	v.check(w.Interpreter != "", "workload.interpreter", "must name a Python interpreter")
	mod, attr, ok := strings.Cut(w.Factory, ":")
	v.check(ok && strings.TrimSpace(mod) != "" && strings.TrimSpace(attr) != "", "workload.factory", "must be \"module:attr\", got %q", w.Factory)
	for i, g := range w.Include {
		v.check(strings.TrimSpace(g) != "", fmt.Sprintf("workload.include[%d]", i), "empty pattern")
	}
	for i, g := range w.Exclude {
		v.check(strings.TrimSpace(g) != "", fmt.Sprintf("workload.exclude[%d]", i), "empty pattern")
	}
	v.check(w.Threads >= 0, "workload.threads", "must be >= 0, got %d", w.Threads)
	deviceOK := validDevice(w.Device)
	v.check(deviceOK, "workload.device", "%q is not auto, cpu, cuda, cuda:N or mps", w.Device)
	switch w.Precision {
	case "", PrecisionFP32, PrecisionBF16:
	case PrecisionFP16:
		v.check(!deviceOK || w.Device != "cpu", "workload.precision",
			"fp16 needs a CUDA device, and workload.device is cpu (use bf16 or fp32 on a CPU)")
	default:
		v.add("workload.precision", "must be fp32, bf16 or fp16, got %q", w.Precision)
	}
	v.check(w.CallTimeout > 0, "workload.call_timeout", "must be > 0")
	v.check(w.TrainTimeout > 0, "workload.train_timeout", "must be > 0")
	switch w.Backend {
	case BackendWorker:
	case BackendCommand:
		v.check(w.Command.Program != "", "workload.command.program", "must be set for backend %q", BackendCommand)
	default:
		v.add("workload.backend", "must be %q or %q, got %q", BackendWorker, BackendCommand, w.Backend)
	}
	validateRanks(v, w)
}

// validateRanks checks workload.devices, ranks, shard and the memory options: what the
// worker would refuse without looking at the machine (whether a GPU exists is its check,
// at start-up).
func validateRanks(v *validator, w Workload) {
	v.check(w.Ranks >= 0, "workload.ranks", "must be >= 0, got %d", w.Ranks)
	v.check(w.RankTimeout > 0, "workload.rank_timeout", "must be > 0")
	world := max(w.Ranks, 1)
	if len(w.Devices) > 0 {
		v.check(w.Device == "" || w.Device == "auto", "workload.devices", "and workload.device (%q) are both set: set one of them", w.Device)
		v.check(w.Ranks <= 1, "workload.ranks", "and workload.devices are both set: ranks counts CPU processes, devices lists GPUs")
		if !w.Devices.All() {
			world = len(w.Devices)
			checkDeviceList(v, w.Devices)
		}
	} else if w.Ranks > 1 && w.Device != "" && w.Device != "auto" && w.Device != "cpu" {
		v.add("workload.ranks", "%d runs ranks on the CPU, and workload.device is %q: list GPUs in workload.devices instead", w.Ranks, w.Device)
	}
	multi := w.Devices.All() || world > 1
	switch w.Shard {
	case "", ShardDDP:
	case ShardFSDP:
		v.check(multi, "workload.shard", "fsdp needs at least two ranks (workload.devices or workload.ranks): with one device there is nothing to shard the model over")
	default:
		v.add("workload.shard", "must be %s or %s, got %q", ShardDDP, ShardFSDP, w.Shard)
	}
	if w.Backend == BackendCommand {
		v.check(!multi, "workload.devices", "needs the worker backend: the checkpoint command runs your own script as it is")
		v.check(!w.ActivationCheckpointing, "workload.activation_checkpointing", "needs the worker backend: the checkpoint command runs your own script as it is")
	}
}

// checkDeviceList checks a list of GPUs: each cuda:N, none twice, no cpu among them.
func checkDeviceList(v *validator, devs []string) {
	seen := map[int]int{}
	cpu, gpu := false, false
	for i, d := range devs {
		field := fmt.Sprintf("workload.devices[%d]", i)
		n, isGPU := strings.CutPrefix(d, "cuda:")
		switch {
		case d == DevicesAll:
			v.add(field, "all stands alone: write devices: all")
		case d == "cpu":
			cpu = true
		case d == "cuda":
			v.add(field, "%q: name each GPU by its index (cuda:0, cuda:1, ...)", d)
		case isGPU && validDevice(d):
			gpu = true
			idx, _ := strconv.Atoi(n)
			if j, ok := seen[idx]; ok {
				v.add(field, "%q names the same GPU as workload.devices[%d]", d, j)
			}
			seen[idx] = i
		default:
			v.add(field, "%q is not a GPU: list them as cuda:0, cuda:1, ...", d)
		}
	}
	switch {
	case cpu && gpu:
		v.add("workload.devices", "mixes cpu and cuda: ranks run on one kind of device (GPUs here, CPU ranks with workload.ranks)")
	case cpu:
		v.add("workload.devices", "lists cpu: set workload.device: cpu and workload.ranks: N for ranks on the CPU")
	}
}

func (c *Config) validateProtocol(v *validator) {
	p := c.Protocol
	switch p.MergePolicy {
	case PolicyDiLoCo, PolicyEMA:
	default:
		v.add("protocol.merge_policy", "must be %q or %q, got %q", PolicyDiLoCo, PolicyEMA, p.MergePolicy)
	}
	v.check(p.InnerSteps >= 1, "protocol.inner_steps", "must be >= 1, got %d", p.InnerSteps)
	if _, err := codecs.Parse(string(p.Codec)); err != nil {
		v.add("protocol.codec", "must be %s, got %q", codecs.List(), p.Codec)
	}
	v.check(p.Overlap == "" || p.Overlap == OverlapEager, "protocol.overlap", "must be empty (no overlap) or %q, got %q", OverlapEager, p.Overlap)
	v.check(p.Int8Block >= 1 && p.Int8Block <= 1<<20, "protocol.int8_block", "must be in [1, 1048576], got %d", p.Int8Block)
	v.check(p.SparseBlock >= 1 && p.SparseBlock <= 1<<24, "protocol.sparse_block", "must be in [1, 16777216], got %d", p.SparseBlock)
	v.check(p.SparseTopK >= 1 && p.SparseTopK <= max(p.SparseBlock, 1), "protocol.sparse_topk", "must be in [1, protocol.sparse_block = %d], got %d", p.SparseBlock, p.SparseTopK)
	v.check(p.SparseWarmupRounds >= 0 && p.SparseWarmupRounds <= 1000, "protocol.sparse_warmup_rounds", "must be in [0, 1000] (0 = no top-k warm-up), got %d", p.SparseWarmupRounds)
	v.check(finite(p.SparseWarmupFactor) && p.SparseWarmupFactor >= 1 && p.SparseWarmupFactor <= 1024, "protocol.sparse_warmup_factor", "must be in [1, 1024] (1 = no top-k warm-up), got %v", p.SparseWarmupFactor)
	v.check(finite(p.SparseFeedbackDecay) && p.SparseFeedbackDecay > 0 && p.SparseFeedbackDecay <= 1, "protocol.sparse_feedback_decay", "must be in (0, 1] (1 = plain error feedback), got %v", p.SparseFeedbackDecay)
	v.check(finite(p.DiLoCo.OuterLR) && p.DiLoCo.OuterLR > 0, "protocol.diloco.outer_lr", "must be > 0 (or 0 in a file: the default for the codec), got %v", p.DiLoCo.OuterLR)
	v.check(finite(p.DiLoCo.Momentum) && p.DiLoCo.Momentum >= 0 && p.DiLoCo.Momentum < 1, "protocol.diloco.momentum", "must be in [0, 1), got %v", p.DiLoCo.Momentum)
	// Error feedback already carries every unsent part of an update into later rounds; outer
	// momentum on top of it compounds the two, so the sparse codec takes at most 0.5
	// (SparseLoCo runs without; docs/design-notes.md).
	v.check(p.Codec != codecs.Sparse || p.MergePolicy != PolicyDiLoCo || p.DiLoCo.Momentum <= 0.5, "protocol.diloco.momentum",
		"must be <= 0.5 with protocol.codec sparse (outer momentum on top of error feedback diverged at 0.9; 0 is SparseLoCo's choice), got %v", p.DiLoCo.Momentum)
	v.check(finite(p.EMA.NewWeight) && p.EMA.NewWeight > 0 && p.EMA.NewWeight <= 1, "protocol.ema.new_weight", "must be in (0, 1], got %v", p.EMA.NewWeight)
}

func (c *Config) validateMerge(v *validator) {
	m := c.Merge
	switch m.Aggregator {
	case "mean", "trimmed_mean", "median", "norm_clip":
	default:
		v.add("merge.aggregator", "must be mean, trimmed_mean, median or norm_clip, got %q", m.Aggregator)
	}
	v.check(finite(m.TrimFraction) && m.TrimFraction >= 0 && m.TrimFraction < 0.5, "merge.trim_fraction", "must be in [0, 0.5), got %v", m.TrimFraction)
	v.check(finite(m.ClipNorm) && m.ClipNorm >= 0, "merge.clip_norm", "must be >= 0, got %v", m.ClipNorm)
	if m.Aggregator == "norm_clip" {
		v.check(m.ClipNorm > 0, "merge.clip_norm", "must be > 0 when merge.aggregator is norm_clip")
	}
	v.check(finite(m.Screen.MaxNorm) && m.Screen.MaxNorm >= 0, "merge.screen.max_norm", "must be >= 0 (0 = off), got %v", m.Screen.MaxNorm)
	v.check(finite(m.Screen.MaxNormRatio) && (m.Screen.MaxNormRatio == 0 || m.Screen.MaxNormRatio > 1), "merge.screen.max_norm_ratio", "must be 0 (off) or > 1, got %v", m.Screen.MaxNormRatio)
	v.check(finite(m.Screen.CosineTolerance) && m.Screen.CosineTolerance >= 0, "merge.screen.cosine_tolerance", "must be >= 0 (0 = fixed min_cosine bar), got %v", m.Screen.CosineTolerance)
	if mc := m.Screen.MinCosine; mc != nil {
		v.check(finite(*mc) && *mc >= -1 && *mc <= 1, "merge.screen.min_cosine", "must be in [-1, 1], got %v", *mc)
	}
	switch m.Screen.Reference {
	case ReferenceAuto, ReferenceOn, ReferenceOff:
	default:
		v.add("merge.screen.reference", "must be auto, on or off, got %q", m.Screen.Reference)
	}
}

func (c *Config) validateLease(v *validator) {
	l := c.Lease
	v.check(l.MicroshardsPerTrainer >= 1 && l.MicroshardsPerTrainer <= MaxMicroshardsPerTrainer, "lease.microshards_per_trainer",
		"must be in [1, %d] (the most one lease may grant), got %d", MaxMicroshardsPerTrainer, l.MicroshardsPerTrainer)
	v.check(l.SamplesPerStep >= 0, "lease.samples_per_step", "must be >= 0 (0 = workload.config.batch_size), got %d", l.SamplesPerStep)
	v.check(l.MinGroup >= 1, "lease.min_group", "must be >= 1, got %d", l.MinGroup)
	v.check(l.RoundTimeout > 0, "lease.round_timeout", "must be > 0")
	v.check(l.MinDeadline > 0 && l.MinDeadline <= l.RoundTimeout, "lease.min_deadline", "must be > 0 and <= lease.round_timeout (%s), got %s", l.RoundTimeout, l.MinDeadline)
	v.check(l.FirstDeadline > 0, "lease.first_deadline", "must be > 0 (it is capped at lease.round_timeout), got %s", l.FirstDeadline)
	v.check(l.QuarantineRounds >= 0, "lease.quarantine_rounds", "must be >= 0, got %d", l.QuarantineRounds)
}

func (c *Config) validateExport(v *validator) {
	e := c.Export
	v.check(e.EveryRounds >= 0, "export.every_rounds", "must be >= 0 (0 = off), got %d", e.EveryRounds)
	if e.EveryRounds > 0 {
		v.check(e.Dir != "", "export.dir", "must be set when export.every_rounds > 0")
	}
	v.check(e.ShardBytes >= 1<<20, "export.shard_bytes", "must be >= 1048576, got %d", e.ShardBytes)
	v.check(e.BlockBytes >= 512 && e.BlockBytes <= 64<<20, "export.block_bytes", "must be in [512, 67108864], got %d", e.BlockBytes)
}

// validDevice accepts the device strings the worker understands: auto, cpu, cuda, cuda:N,
// mps. Whether the machine has that device is the worker's check at start-up.
func validDevice(d string) bool {
	switch d {
	case "", "auto", "cpu", "cuda", "mps":
		return true
	}
	n, ok := strings.CutPrefix(d, "cuda:")
	if !ok || n == "" || len(n) > 3 {
		return false
	}
	for _, r := range n {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
