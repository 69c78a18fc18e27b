package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/checkpoint"
	"github.com/p2pnode/p2pnode/codecs"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/export"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/p2p"
	"github.com/p2pnode/p2pnode/pyruntime"
	"github.com/p2pnode/p2pnode/round"
	"github.com/p2pnode/p2pnode/status"
	"github.com/p2pnode/p2pnode/trainer"
	"github.com/p2pnode/p2pnode/upkeep"
)

func rolesModule(cfg *config.Config) fx.Option {
	return fx.Module("roles",
		fx.Provide(
			func(self peer.ID) *status.Board {
				return status.NewBoard(status.Status{Peer: self.String(), Roles: cfg.Experiment.Roles, Network: cfg.Experiment.Network,
					Experiment: cfg.Experiment.ID, Started: time.Now()})
			},
			func(self peer.ID) validatorPeers { return validatorSet(cfg, self) },
			func(heads *chain.Store, vs validatorPeers) *chain.Tips {
				return chain.NewTips(heads, vs, cfg.Experiment.Quorum)
			},
			func(ck *checkpoint.Checkpointer) *upkeep.Keeper {
				return upkeep.NewKeeper(ck, cfg.Experiment.HasRole(config.RoleValidator) || rebuildsHeads(cfg))
			},
			func() wrapWindows { return honestWindows },
			newEnv,
			func(e *env) headFetcher { return e.fetchHeadArtifacts },
			// The loops every node runs.
			asLoop(func(e *env) *headsLoop { return &headsLoop{env: e} }),
			asLoop(func(e *env) *announcer { return &announcer{env: e, started: time.Now().UnixMilli()} }),
			asLoop(func(e *env, sd fx.Shutdowner) *watcher { return &watcher{env: e, stop: func() { _ = sd.Shutdown() }} }),
		),
		roleModules(cfg),
		fx.Invoke(startLoops),
	)
}

// loop is one of the node's long-running parts: the roles, and the loops every node runs
// (head sync, announcer, watcher). Each module puts its loop in the "loops" group; they all
// run, once start-up is done, until one fails or the node stops.
type loop interface {
	// name labels the loop's errors.
	name() string
	// run runs the loop until ctx ends, with what start-up made.
	run(ctx context.Context, s *startup) error
}

// asLoop annotates a constructor of a loop so that its result joins the "loops" group.
func asLoop(constructor any) any {
	return fx.Annotate(constructor, fx.As(new(loop)), fx.ResultTags(`group:"loops"`))
}

// startup is what start-up (startUp) hands the loops: the dataset, the round.Trainer
// restored from the checkpoint, the trainer's measured speed and the merge policy.
type startup struct {
	data     *dataState
	work     *round.Trainer
	capacity *trainer.Capacity
	policy   round.Policy
	params   int64 // the model's parameter count (0: the workload did not say)
}

// validatorPeers are the peers whose signatures make a head canonical (validatorSet).
type validatorPeers []string

// headFetcher makes sure the artifacts a head needs are here (env.fetchHeadArtifacts).
type headFetcher func(ctx context.Context, h *chain.Head, hints ...peer.ID) error

// roleModules is one fx module per role this node has, as the config's experiment.roles
// selects them (the celestia-node nodebuilder pattern): each provides its role's loop,
// made from the dependencies it declares.
func roleModules(cfg *config.Config) fx.Option {
	var mods []fx.Option
	if cfg.Experiment.HasRole(config.RoleValidator) {
		mods = append(mods, fx.Module("validator", fx.Provide(asLoop(newValidatorRole))))
	}
	if cfg.Experiment.HasRole(config.RoleTrainer) {
		mods = append(mods, fx.Module("trainer", fx.Provide(asLoop(newTrainerRole))))
	}
	return fx.Options(mods...)
}

// validatorSet is the configured validators, or this node alone when none are configured
// and it is a validator itself.
func validatorSet(cfg *config.Config, self peer.ID) []string {
	if len(cfg.Experiment.Validators) > 0 {
		return cfg.Experiment.Validators
	}
	return []string{self.String()}
}

type envParams struct {
	fx.In
	Cfg        *config.Config
	Opts       Options
	Log        *slog.Logger
	Self       peer.ID
	Key        crypto.PrivKey
	Host       host.Host
	Bus        bus.Bus
	Tips       *chain.Tips
	Store      *artifact.Store
	Heads      *chain.Store
	Runtime    pyruntime.Runtime `optional:"true"` // absent without a workload
	Status     *status.Board
	Keeper     *upkeep.Keeper
	Metrics    *status.Metrics
	Export     *export.Writer `optional:"true"` // absent with export off
	Pruner     *upkeep.Pruner `optional:"true"` // absent with node.archive
	Wrap       wrapWindows
	Bytes      *p2p.ByteCounter `optional:"true"` // absent with a given host
	Validators validatorPeers
}

func newEnv(p envParams) (*env, error) {
	policy, err := mergePolicy(p.Cfg)
	if err != nil {
		return nil, err
	}
	if p.Runtime != nil {
		p.Status.Worker = func() any { return p.Runtime.Status() }
		p.Status.TokensPerSample = func() int64 { return p.Runtime.Status().TokensPerSample }
	}
	if g, ok := p.Bus.(interface{ Rejections() map[string]uint64 }); ok {
		p.Status.GossipRejects = g.Rejections
	}
	p.Status.Conns = func() (peers, addrs []string) {
		for _, id := range p.Host.Network().Peers() {
			peers = append(peers, id.String())
		}
		return peers, p2p.HostAddrs(p.Host)
	}
	e := &env{cfg: p.Cfg, policy: policy, log: p.Log.With("pkg", "node"), rootLog: p.Log, self: p.Self.String(), key: p.Key, host: p.Host, bus: p.Bus, tips: p.Tips,
		store: p.Store, heads: p.Heads, rt: p.Runtime, status: p.Status, keeper: p.Keeper,
		validators: p.Validators, progress: p.Opts.Progress, work: p.Opts.Work, metrics: p.Metrics, peers: &status.PeerRounds{}, wrapWork: p.Wrap, exporter: p.Export,
		bytes: p2p.NewByteMeter(p.Bytes), pruner: p.Pruner}
	p.Status.Peers = func(round uint64) []status.PeerStatus {
		return status.PeerTable(e.self, p.Cfg.Experiment.Roles, round, e.validators, e.peers, p.Host)
	}
	if rebuildsHeads(p.Cfg) {
		e.rebuild = &round.Merger{Store: p.Store, Policy: policy}
	}
	return e, nil
}

// rebuildsHeads says whether this node makes each new head's parameters itself from the
// parent and the round's contributions instead of downloading them: a trainer (validators
// compute every head anyway) on the sparse codec, whose contributions are ~0.5 % of the
// model each.
func rebuildsHeads(cfg *config.Config) bool {
	return !cfg.Experiment.HasRole(config.RoleValidator) && cfg.Experiment.HasRole(config.RoleTrainer) && cfg.Protocol.Codec == diloco.Sparse
}

// startLoops runs start-up (dataset, worker, checkpoint) and then the loops in the
// background, on a context that lives as long as the app.
func startLoops(p loopParams) {
	runInBackground(p.Lc, func(ctx context.Context) {
		if err := runLoops(ctx, p.Env, p.Loops); err != nil && !errors.Is(err, context.Canceled) {
			// Run returns err to the caller, which reports it once.
			p.Env.log.Debug("node failed", "err", err)
			p.Errs.set(err)
			_ = p.Sd.Shutdown(fx.ExitCode(1))
		}
	}, nil)
}

type loopParams struct {
	fx.In
	Lc    fx.Lifecycle
	Sd    fx.Shutdowner
	Env   *env
	Errs  *loopErrors
	Loops []loop `group:"loops"`
}

// startUp does the long start-up work: it starts the workload, loads (or prepares) the
// dataset, restores the node's state from its checkpoint or chain, and probes a trainer's
// speed.
func startUp(ctx context.Context, e *env) (*startup, error) {
	cfg, policy := e.cfg, e.policy
	var params int64
	if e.rt != nil {
		e.log.Info("starting workload", "factory", cfg.Workload.Factory, "interpreter", cfg.Workload.Interpreter)
		info, err := e.rt.Start(ctx)
		if err != nil {
			return nil, fmt.Errorf("start workload: %w", err)
		}
		e.log.Info("workload ready", "workload", info.Workload, "device", info.Device, "device_name", info.DeviceName,
			"precision", info.Precision, "params", info.ParamCount)
		params = info.ParamCount
		for _, w := range info.Warnings {
			e.log.Warn("workload: "+w, "interpreter", cfg.Workload.Interpreter)
		}
	}
	data, err := loadData(ctx, cfg, runtimeOptions(cfg, e.rootLog), e.store, busFetcher{e.bus}, e.work, e.rootLog)
	if err != nil {
		return nil, err
	}
	if e.pruner != nil {
		e.pruner.SetDataset(data.shards.IDs())
	}
	work := &round.Trainer{Runtime: e.rt, Store: e.store, Shards: data, Codec: policy.Codec,
		Int8Block: policy.Int8Block, Sparse: policy.Sparse, FeedbackDecay: cfg.Protocol.SparseFeedbackDecay}
	if err := restore(ctx, e, work); err != nil {
		return nil, err
	}
	// After restore set the residual, before any loop can checkpoint.
	e.keeper.TrackResidual(work.ReadResidual)

	capac := &trainer.Capacity{}
	if cfg.Experiment.HasRole(config.RoleTrainer) {
		probeSpeed(ctx, e, data, capac)
	}
	return &startup{data: data, work: work, capacity: capac, policy: policy, params: params}, nil
}

// runLoops does start-up and then runs the loops until one fails or ctx ends.
func runLoops(ctx context.Context, e *env, loops []loop) error {
	s, err := startUp(ctx, e)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(loops))
	for _, l := range loops {
		go func() {
			err := l.run(ctx, s)
			if err != nil && !errors.Is(err, context.Canceled) {
				err = fmt.Errorf("%s: %w", l.name(), err)
			}
			errc <- err
		}()
	}
	var first error
	for range loops {
		err := <-errc
		if err != nil && !errors.Is(err, context.Canceled) && first == nil {
			first = err
		}
		cancel()
	}
	return first
}

// newerTip returns the head recorded in the tip file when it descends from the
// checkpointed head and its artifacts verify: a node killed between making a head
// canonical and checkpointing it resumes at that head, not one round earlier.
func newerTip(ctx context.Context, e *env, ckID cid.Cid, ck *chain.Head, until time.Time) (cid.Cid, *chain.Head, bool) {
	stores := &Stores{Artifacts: e.store, Heads: e.heads, dir: e.cfg.Node.StoreDir}
	tid, err := stores.ResolveHead("latest")
	if err != nil || tid.Equals(ckID) {
		return cid.Undef, nil, false
	}
	// A damaged tip head is asked from peers like the checkpoint's own.
	th, err := e.headOrRefetch(ctx, tid, until)
	if err != nil || th.Round <= ck.Round {
		return cid.Undef, nil, false
	}
	descends := false
	_ = e.heads.Walk(tid, func(id cid.Cid, h *chain.Head) error {
		if h.Round <= ck.Round {
			descends = id.Equals(ckID)
			return chain.StopWalk
		}
		return nil
	})
	if !descends {
		return cid.Undef, nil, false
	}
	for _, get := range e.headArtifacts(th) {
		a, err := get()
		if err != nil || (a.Defined() && e.store.Verify(a) != nil) {
			return cid.Undef, nil, false
		}
	}
	return tid, th, true
}

// mergePolicy maps the protocol and merge config to the validator's policy.
func mergePolicy(cfg *config.Config) (round.Policy, error) {
	codec, err := codecs.Parse(string(cfg.Protocol.Codec))
	if err != nil {
		return round.Policy{}, fmt.Errorf("protocol.codec: %w", err)
	}
	agg, err := merge.ParseAggregator(cfg.Merge.Aggregator)
	if err != nil {
		return round.Policy{}, fmt.Errorf("merge.aggregator: %w", err)
	}
	p := round.Policy{
		Kind:       cfg.Protocol.MergePolicy,
		Outer:      diloco.OuterConfig{LR: cfg.Protocol.DiLoCo.OuterLR, Momentum: cfg.Protocol.DiLoCo.Momentum, Nesterov: cfg.Protocol.DiLoCo.Nesterov},
		NewWeight:  cfg.Protocol.EMA.NewWeight,
		Aggregator: agg,
		Aggregate:  merge.AggregateOptions{TrimFraction: cfg.Merge.TrimFraction, ClipNorm: cfg.Merge.ClipNorm},
		Screen: merge.ScreenConfig{MaxNorm: cfg.Merge.Screen.MaxNorm, MaxNormRatio: cfg.Merge.Screen.MaxNormRatio,
			CosineTolerance: cfg.Merge.Screen.CosineTolerance},
		Codec:     codec,
		Int8Block: cfg.Protocol.Int8Block,
		Sparse: diloco.SparseShape{Block: cfg.Protocol.SparseBlock, TopK: cfg.Protocol.SparseTopK,
			Warmup: cfg.Protocol.SparseWarmupRounds, WarmupFactor: cfg.Protocol.SparseWarmupFactor},
	}
	if mc := cfg.Merge.Screen.MinCosine; mc != nil {
		p.Screen.MinCosine = mc
	}
	return p, nil
}

// busFetcher lets the dataset's shard store get files through the bus.
type busFetcher struct{ bus bus.Bus }

func (f busFetcher) Fetch(ctx context.Context, id cid.Cid) error { return f.bus.Fetch(ctx, id) }
