package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/dig"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/checkpoint"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/internal/progress"
	"github.com/p2pnode/p2pnode/p2p"
	"github.com/p2pnode/p2pnode/pyruntime"
	"github.com/p2pnode/p2pnode/status"
	"github.com/p2pnode/p2pnode/upkeep"
)

// Options are what the caller adds to a config.
type Options struct {
	// Progress receives one line per canonical head (nil = none).
	Progress io.Writer
	// Work shows the progress of long work: fetching a head's parameters or the dataset,
	// catching up on the chain, exporting (nil = not shown).
	Work progress.Tracker
	// Logger is the root logger (default slog.Default()).
	Logger *slog.Logger
	// Runtime replaces the configured workload (tests use a synthetic Go workload).
	Runtime pyruntime.Runtime
	// Host replaces the libp2p host built from node.listen (tests use mocknet hosts); the
	// caller owns it. Discovery (bootstrap, DHT, mDNS) is off with a given host.
	Host host.Host
}

// Node is a running p2pnode: build it with New, then Run it.
type Node struct {
	app    *fx.App
	status *status.Board
	http   *status.HTTPServer
	errs   *loopErrors
	self   peer.ID
	reg    *prometheus.Registry
}

// New assembles a node from the config. It does no long work: the dataset, the Python worker
// and the role loops start in Run.
func New(cfg *config.Config, opts Options) (*Node, error) { return newNode(cfg, opts) }

// newNode is New with extra fx options appended to the graph: in-package tests decorate
// parts of a node (an attacker's bus) without test hooks in Options.
func newNode(cfg *config.Config, opts Options, extra ...fx.Option) (*Node, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := ensureWritableDir(cfg.Node.StoreDir); err != nil {
		return nil, fmt.Errorf("node.store_dir: %w", err)
	}
	n := &Node{}
	app := fx.New(
		fx.WithLogger(func() fxevent.Logger {
			l := &fxevent.SlogLogger{Logger: opts.Logger.With("pkg", "fx")}
			// fx's own errors too: New and Run return the root cause, which the caller
			// reports once, instead of fx's wrapped chain of reflect stubs.
			l.UseLogLevel(slog.LevelDebug)
			l.UseErrorLevel(slog.LevelDebug)
			return l
		}),
		Module(cfg, opts),
		fx.Populate(&n.status, &n.errs, &n.self, &n.reg),
		fx.Invoke(func(p struct {
			fx.In
			HTTP *status.HTTPServer `optional:"true"`
		}) {
			n.http = p.HTTP
		}),
		fx.Options(extra...),
	)
	if err := app.Err(); err != nil {
		return nil, dig.RootCause(err) // it names the setting; fx's wrapping only adds reflect stubs
	}
	n.app = app
	return n, nil
}

// Module is the whole node as one fx option; the graph test validates it per role mix.
func Module(cfg *config.Config, opts Options) fx.Option {
	return fx.Options(
		fx.Supply(cfg, opts),
		fx.Provide(
			func(o Options) *slog.Logger { return o.Logger },
			status.NewRegistry,
			func(r *prometheus.Registry) prometheus.Registerer { return r },
			status.NewMetrics,
			func() *loopErrors { return &loopErrors{} },
		),
		storageModule(cfg),
		pruneModule(cfg),
		identityModule(cfg, opts),
		hostModule(cfg, opts),
		discoveryModule(cfg, opts),
		runtimeModule(cfg, opts),
		busModule(cfg),
		inviteModule(cfg),
		// HTTP before the roles: its OnStart (binding the port) runs before the role loops
		// start, so a port in use fails start-up before any work begins.
		httpModule(cfg),
		rolesModule(cfg),
		exportModule(cfg),
		fx.Invoke(p2p.RegisterPeersGauge),
	)
}

func storageModule(cfg *config.Config) fx.Option {
	return fx.Module("storage",
		fx.Provide(
			func(log *slog.Logger) (*artifact.Store, error) {
				return artifact.OpenStore(filepath.Join(cfg.Node.StoreDir, "artifacts"), artifact.Options{ChunkSize: cfg.Node.ChunkSize})
			},
			func() (*chain.Store, error) { return chain.OpenStore(filepath.Join(cfg.Node.StoreDir, "heads")) },
			fx.Annotate(
				func(p checkpointParams) (*checkpoint.Checkpointer, error) {
					store, pr, log := p.Store, p.Pruner, p.Log
					var opts []checkpoint.Option
					if pr != nil {
						// Kept generations pin their heads' artifacts: more of them than
						// node.keep_heads would keep older heads alive.
						opts = append(opts, checkpoint.KeepGenerations(min(cfg.Node.KeepHeads, 3)), checkpoint.AfterPrune(pr.AfterCheckpoint))
					}
					return checkpoint.Open(filepath.Join(cfg.Node.StoreDir, "state"), store, log.With("pkg", "checkpoint"), opts...)
				},
				fx.OnStop(func(ctx context.Context, c *checkpoint.Checkpointer) error { return c.Close() }),
			),
		),
	)
}

type checkpointParams struct {
	fx.In
	Store  *artifact.Store
	Pruner *upkeep.Pruner `optional:"true"` // absent with node.archive
	Log    *slog.Logger
}

// pruneModule deletes what no kept head, checkpoint or open round needs from the artifact
// store, after each checkpoint (upkeep.Pruner); absent with node.archive.
func pruneModule(cfg *config.Config) fx.Option {
	if cfg.Node.Archive {
		return fx.Options()
	}
	return fx.Module("prune",
		fx.Provide(func(store *artifact.Store, heads *chain.Store, t *chain.Tips, m *status.Metrics, log *slog.Logger) *upkeep.Pruner {
			// Keep the tip's contributions where trainers rebuild heads from them.
			return upkeep.NewPruner(store, heads, t, cfg.Node.KeepHeads, cfg.Protocol.Codec == diloco.Sparse, cfg.Node.StoreDir,
				upkeep.PruneCounters{Artifacts: m.PrunedArtifacts, Bytes: m.PrunedBytes}, log.With("pkg", "node", "component", "prune"))
		}),
		fx.Invoke(func(p *upkeep.Pruner, x *artifact.Exchange) { p.SetPartials(x.RemoveIdlePartials) }),
	)
}

func identityModule(cfg *config.Config, opts Options) fx.Option {
	if opts.Host != nil {
		return fx.Module("identity",
			fx.Provide(
				func() (crypto.PrivKey, error) {
					k := opts.Host.Peerstore().PrivKey(opts.Host.ID())
					if k == nil {
						return nil, fmt.Errorf("identity: the given host has no private key in its peerstore")
					}
					return k, nil
				},
				func() peer.ID { return opts.Host.ID() },
			),
		)
	}
	path := cfg.Node.Identity
	if path == "" {
		path = filepath.Join(cfg.Node.StoreDir, "identity.key")
	}
	return fx.Module("identity",
		fx.Provide(
			func(log *slog.Logger) (crypto.PrivKey, error) {
				k, err := p2p.LoadIdentity(path, log)
				if err != nil && cfg.Node.Identity != "" {
					return nil, fmt.Errorf("node.identity: %w", err)
				}
				if err != nil {
					return nil, fmt.Errorf("node.store_dir: %w", err)
				}
				return k, nil
			},
			func(k crypto.PrivKey) (peer.ID, error) { return peer.IDFromPrivateKey(k) },
		),
	)
}

// runtimeOptions maps the workload config to the Python runtime's options.
func runtimeOptions(cfg *config.Config, log *slog.Logger) pyruntime.Options {
	w := cfg.Workload
	return pyruntime.Options{
		Interpreter: w.Interpreter, Factory: w.Factory, Config: w.Config, PythonPath: w.PythonPath, Env: w.Env,
		Include: w.Include, Exclude: w.Exclude, Device: w.Device, Precision: w.Precision, Threads: w.Threads, Seed: cfg.Experiment.Seed,
		Devices: w.Devices, Ranks: w.Ranks, Shard: w.Shard, ActivationCheckpointing: w.ActivationCheckpointing, RankTimeout: w.RankTimeout,
		CallTimeout: w.CallTimeout, TrainTimeout: w.TrainTimeout, Backend: w.Backend,
		Command:        pyruntime.CommandOptions{Program: w.Command.Program, Args: w.Command.Args, Env: w.Command.Env},
		Logger:         log.With("pkg", "pyruntime"),
		DiskScratchDir: filepath.Join(cfg.Node.StoreDir, "scratch"),
	}
}

// needsRuntime: trainers train through the workload; validators initialise the model and
// evaluate heads with it.
func needsRuntime(cfg *config.Config) bool {
	return cfg.Experiment.HasRole(config.RoleTrainer) || cfg.Experiment.HasRole(config.RoleValidator)
}

func runtimeModule(cfg *config.Config, opts Options) fx.Option {
	if !needsRuntime(cfg) {
		return fx.Options()
	}
	if opts.Runtime != nil {
		return fx.Module("runtime", fx.Provide(func(reg prometheus.Registerer) pyruntime.Runtime {
			return pyruntime.Instrument(opts.Runtime, reg)
		}))
	}
	return fx.Module("runtime",
		fx.Provide(fx.Annotate(
			func(log *slog.Logger, reg prometheus.Registerer) (pyruntime.Runtime, error) {
				rt, err := pyruntime.New(runtimeOptions(cfg, log))
				if err != nil {
					return nil, err
				}
				return pyruntime.Instrument(rt, reg), nil
			},
			fx.OnStop(func(ctx context.Context, rt pyruntime.Runtime) error { return rt.Close() }),
		)),
	)
}

// busModule puts the node on the network: GossipSub topics for messages, the artifact
// exchange for bytes, and the head-sync protocol for catching up.
func busModule(cfg *config.Config) fx.Option {
	return fx.Module("bus",
		fx.Provide(
			fx.Annotate(
				func(h host.Host, store *artifact.Store, reg prometheus.Registerer, opts Options, log *slog.Logger) (*artifact.Exchange, error) {
					relays, err := p2p.BootstrapPeers(cfg)
					if err != nil {
						return nil, err
					}
					return artifact.NewExchange(h, store, artifact.ExchangeOptions{FrameDeadline: cfg.Node.StreamDeadline, Logger: log.With("pkg", "artifact"),
						Registerer: reg, Progress: opts.Work, Relays: relays}), nil
				},
				fx.OnStop(func(_ context.Context, x *artifact.Exchange) error { return x.Close() }),
			),
			func(lc fx.Lifecycle, h host.Host, self peer.ID, reg prometheus.Registerer, log *slog.Logger) (*gossip.Gossip, error) {
				ctx, cancel := context.WithCancel(context.Background())
				g, err := gossip.New(ctx, gossip.Params{Host: h, Network: cfg.Experiment.Network, Experiment: cfg.Experiment.ID,
					Validators: validatorIDs(cfg, self), Logger: log.With("pkg", "gossip"), Registerer: reg})
				if err != nil {
					cancel()
					return nil, fmt.Errorf("gossip: %w", err)
				}
				lc.Append(fx.StopHook(func() error { cancel(); return g.Close() }))
				return g, nil
			},
			func(lc fx.Lifecycle, h host.Host, g *gossip.Gossip, x *artifact.Exchange, log *slog.Logger) bus.Bus {
				b := p2p.NewNetBus(g, x, h.ConnManager(), log.With("pkg", "bus"))
				runInBackground(lc, b.Run, nil)
				return b
			},
		),
		fx.Invoke(func(lc fx.Lifecycle, h host.Host, heads *chain.Store, t *chain.Tips, log *slog.Logger) {
			tip := func() cid.Cid { id, _ := t.Current(); return id }
			svc := chain.NewSyncService(h, heads, tip, log.With("pkg", "chain"), cfg.Node.StreamDeadline)
			lc.Append(fx.StopHook(svc.Close))
		}),
	)
}

// validatorIDs is validatorSet as peer ids (validated by config).
func validatorIDs(cfg *config.Config, self peer.ID) []peer.ID {
	var out []peer.ID
	for _, s := range validatorSet(cfg, self) {
		if id, err := peer.Decode(s); err == nil {
			out = append(out, id)
		}
	}
	return out
}

func httpModule(cfg *config.Config) fx.Option {
	if cfg.Node.HTTP == "" || cfg.Node.HTTP == "off" {
		return fx.Options()
	}
	return fx.Module("http",
		fx.Provide(fx.Annotate(
			func(b *status.Board, reg *prometheus.Registry, log *slog.Logger, opts Options) *status.HTTPServer {
				h := status.NewHTTPServer(cfg.Node.HTTP, filepath.Join(cfg.Node.StoreDir, status.HTTPAddrFile), b, reg, log.With("pkg", "http"))
				h.Announce = opts.Progress
				if cfg.Node.HTTP == config.DefaultHTTP {
					h.Fallback = 9
				}
				return h
			},
			fx.OnStart(func(ctx context.Context, h *status.HTTPServer) error { return h.Start(ctx) }),
			fx.OnStop(func(ctx context.Context, h *status.HTTPServer) error { return h.Stop(ctx) }),
		)),
		fx.Invoke(func(*status.HTTPServer) {}),
	)
}

// loopErrors keeps the first error a role loop failed with.
type loopErrors struct {
	mu  sync.Mutex
	err error
}

func (l *loopErrors) set(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
	}
}

func (l *loopErrors) get() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Run starts the node and blocks until ctx is cancelled, the experiment's round limit is
// reached, or a role loop fails; it returns that failure.
func (n *Node) Run(ctx context.Context) error {
	if err := n.app.Start(ctx); err != nil {
		return dig.RootCause(err)
	}
	select {
	case <-ctx.Done():
	case <-n.app.Wait():
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), n.app.StopTimeout())
	defer cancel()
	stopErr := n.app.Stop(stopCtx)
	if err := n.errs.get(); err != nil {
		return err
	}
	if stopErr != nil && !errors.Is(stopErr, context.Canceled) {
		return fmt.Errorf("stop node: %w", stopErr)
	}
	return nil
}

// Status returns the node's current status.
func (n *Node) Status() status.Status { return n.status.Snapshot() }

// HTTPAddr is the bound status address ("" when HTTP is off or not started).
func (n *Node) HTTPAddr() string {
	if n.http == nil {
		return ""
	}
	return n.http.Addr()
}

// ID is the node's peer id.
func (n *Node) ID() peer.ID { return n.self }
