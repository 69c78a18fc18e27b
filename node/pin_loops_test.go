package node

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/checkpoint"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/internal/testenv"
	"github.com/p2pnode/p2pnode/status"
	"github.com/p2pnode/p2pnode/synth"
	"github.com/p2pnode/p2pnode/upkeep"
)

// hubBus is a Bus joining the nodes of one process: every message goes to every node
// (the sender too, as on GossipSub), and all nodes share one artifact store, so a fetch
// finds what any node stored.
type hubBus struct {
	bus.Fanout
	hub   *busHub
	self  string
	store *artifact.Store
}

type busHub struct {
	mu    sync.Mutex
	buses []*hubBus
}

func (h *busHub) join(self string, store *artifact.Store) *hubBus {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := &hubBus{hub: h, self: self, store: store}
	h.buses = append(h.buses, b)
	return b
}

func (b *hubBus) Publish(_ context.Context, msg any) error {
	b.hub.mu.Lock()
	buses := slices.Clone(b.hub.buses)
	b.hub.mu.Unlock()
	for _, o := range buses {
		o.Deliver(b.self, msg)
	}
	return nil
}

func (b *hubBus) FetchAtMost(ctx context.Context, id cid.Cid, _ uint64, hints ...peer.ID) error {
	return b.Fetch(ctx, id, hints...)
}

func (b *hubBus) Fetch(_ context.Context, id cid.Cid, _ ...peer.ID) error {
	if b.store.Has(id) {
		return nil
	}
	return fmt.Errorf("fetch %s: %w", id, artifact.ErrNotFound)
}

// runPinnedLoops runs the pinned experiment through the role loops themselves (runLoops:
// start-up, head sync, announcer, watcher, validator or trainer), one validator and three
// trainers joined by a hubBus, inside a synctest bubble: the clock is fake and moves only
// when every loop waits, so each lease's expiry, every deadline and every "has the leader
// heard the fleet" falls at the same instant in every run, and the heads are those of
// runPinned exactly when the loops issue the same leases and merge the same contributions.
func runPinnedLoops(t *testing.T, policyKind, codec string) pinnedRun {
	t.Helper()
	dir := t.TempDir()
	cfg := pinConfig(t, dir, policyKind, codec)
	cfg.Experiment.Rounds = pinRounds
	cfg.Node.HTTP = "off"

	// Hosts, unlinked, made outside the bubble: head sync and status ask them for peers
	// (none), and head sync's catch-up requests over them fail at once (no link).
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	names := []string{"validator"}
	for i := range pinTrainers {
		names = append(names, fmt.Sprintf("trainer-%d", i))
	}
	_, vid := testenv.Key(t, "validator")
	var hosts []host.Host
	for i, name := range names {
		key, _ := testenv.Key(t, name)
		h, err := mn.AddPeer(key, ma.StringCast(fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", 4000+i)))
		require.NoError(t, err)
		hosts = append(hosts, h)
	}
	var run pinnedRun
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		log := slog.New(slog.DiscardHandler)
		store, err := artifact.OpenStore(filepath.Join(dir, "artifacts"), artifact.Options{ChunkSize: cfg.Node.ChunkSize})
		require.NoError(t, err)
		hub := &busHub{}
		var envs []*env
		var cks []*checkpoint.Checkpointer
		for i, name := range names {
			key, id := testenv.Key(t, name)
			pid, err := peer.Decode(id)
			require.NoError(t, err)
			ncfg := *cfg
			ncfg.Node.StoreDir = filepath.Join(dir, name)
			ncfg.Experiment.Validators = []string{vid}
			ncfg.Experiment.Roles = []string{config.RoleTrainer}
			if i == 0 {
				ncfg.Experiment.Roles = []string{config.RoleValidator}
			}
			heads, err := chain.OpenStore(filepath.Join(ncfg.Node.StoreDir, "heads"))
			require.NoError(t, err)
			ck, err := checkpoint.Open(filepath.Join(ncfg.Node.StoreDir, "state"), store, log)
			require.NoError(t, err)
			cks = append(cks, ck)
			e, err := newEnv(envParams{Cfg: &ncfg, Log: log, Self: pid, Key: key, Host: hosts[i], Bus: hub.join(id, store),
				Tips: chain.NewTips(heads, validatorSet(&ncfg, pid), ncfg.Experiment.Quorum), Store: store, Heads: heads, Wrap: honestWindows,
				Validators: validatorSet(&ncfg, pid),
				Runtime:    synth.New(filepath.Join(ncfg.Node.StoreDir, "scratch")), Status: &status.Board{},
				Keeper: upkeep.NewKeeper(ck, i == 0 || rebuildsHeads(&ncfg)), Metrics: status.NewMetrics(prometheus.NewRegistry())})
			require.NoError(t, err)
			envs = append(envs, e)
		}
		errs := make(chan error, len(envs))
		var stopped sync.Map
		start := func(i int) {
			go func() {
				e := envs[i]
				err := runLoops(ctx, e, loopsOf(t, e, log, func() { stopped.Store(names[i], true) }))
				if err != nil {
					err = fmt.Errorf("%s: %w", names[i], err)
				}
				errs <- err
			}()
		}
		// The trainers first, until their loops wait (subscribed), then the validator, at
		// the same fake instant: a trainer that subscribed after genesis was published
		// would have to catch up over libp2p (headsync.Sync.catchUp), which this bus does not
		// carry, and the run would hang on which goroutine the scheduler ran first.
		for i := 1; i < len(envs); i++ {
			start(i)
		}
		synctest.Wait()
		start(0)
		// Every node ends by itself at the round limit (its watcher stops it); a run that
		// does not get there in a few (fake) minutes is stuck.
		limit := time.After(10 * time.Minute)
		var failed []error
		for range envs {
			select {
			case err := <-errs:
				if err != nil {
					failed = append(failed, err)
				}
			case <-limit:
				var at []string
				for i, e := range envs {
					_, h := e.tips.Current()
					_, ok := stopped.Load(names[i])
					round := "no head"
					if h != nil {
						round = fmt.Sprintf("round %d", h.Round)
					}
					at = append(at, fmt.Sprintf("%s at %s (stopped %v)", names[i], round, ok))
				}
				failed = append(failed, fmt.Errorf("stuck after 10 fake minutes: %v", at))
				cancel()
			}
			if len(failed) > 0 {
				break
			}
		}
		cancel()
		synctest.Wait()
		require.Empty(t, failed)
		for _, name := range names {
			_, ok := stopped.Load(name)
			require.True(t, ok, "%s did not reach the round limit", name)
		}
		for _, ck := range cks {
			require.NoError(t, ck.Close())
		}
		tip, _ := envs[0].tips.Current()
		ids, hs, err := envs[0].heads.Chain(tip)
		require.NoError(t, err)
		for i, h := range hs {
			pid, err := h.ParamsID()
			require.NoError(t, err)
			oid, err := h.OuterStateID()
			require.NoError(t, err)
			outer := ""
			if oid.Defined() {
				outer = oid.String()
			}
			run.heads, run.params, run.outer = append(run.heads, ids[i].String()), append(run.params, pid.String()), append(run.outer, outer)
		}
		for _, e := range envs[1:] {
			id, _ := e.tips.Current()
			require.Equal(t, tip, id, "every trainer ends on the validator's head")
		}
	})
	return run
}

// pinnedLoopHeads are the heads the node's loops make for pinnedRuns. Their params are the
// direct run's (the same contributions merged the same way), but not their heads: a young
// chain's leader waits for joining trainers before its first grant (the lease times differ)
// and proposes against its own reference window (validator/reference.go), which its heads
// name (chain.Head.Reference): the direct run has neither.
var pinnedLoopHeads = map[string][]string{
	"diloco-fp32": {
		"bafireidfek3tmdbs7jgi5s4v4ehmma4r725xr3huxl7zxh7xmhznm33fz4",
		"bafireie43mszd66eoskgdm5pd7qpu26rmzdqevlfhfi3htrbcb6hitwzl4",
		"bafireifchpqhmk5avhwedrx3beq4dtgqcze6fqg2wic7xqqivvnepz7pra",
		"bafireif4q45qyzhwgrz2xxnfs2tojjet3hgmd3akpidzsqk73ljmkbws6a",
		"bafireig2zp4xlzq4kf2yb3ddwrw7izpwfmpismbzb3hgugdtvz6zbugasu",
	},
	"ema-int8": {
		"bafireih6qdvplzexxegw3aflmsvjkcni3pqg72ubajlprqk4mwj4d6omy4",
		"bafireiekgizueuqez5kuxpg6t4wkvodhicyvwtvpu3ac74mwiramzby7we",
		"bafireiba7os47eurk5ipl7rgavxa6zglcmcpqzsa5ettckzfsvbhtc6kme",
		"bafireie5yb22cuyk55gkeljq36ru2imdrwx3fku2f3bnppo57qaghjtfj4",
		"bafireigi47yuaba5tiezm7xmfbv3ljchpjjr66prpnu4xqeb4654ijsavu",
	},
	"diloco-sparse": {
		"bafireibyhbk43rfsim74j6ew7rhk4hh6atosma3fgrkhlofsjl5474xhq4",
		"bafireiejelcf7nbnf24ig4vlckcolqwo3ijfsygggwrn2dcigdr42m6huy",
		"bafireidbrz5getfuwxecgwgecfqpkq56oiw2ilvan7jhelabfjeubsz5bu",
		"bafireidtebis4o4k5rdwxhhnqjjwrbqwqxbead72u3rklige46dkt7p36m",
		"bafireifb5ma52lfkznmlhapfoiuuqbvjpx2may5gnsnsddgroo5vbfiexi",
	},
}

func TestPinnedLoopsRunHeads(t *testing.T) {
	for _, tc := range pinnedRuns {
		t.Run(tc.name, func(t *testing.T) {
			got := runPinnedLoops(t, tc.policy, tc.codec)
			t.Logf("heads:  %q", got.heads)
			t.Logf("params: %q", got.params)
			require.Equal(t, tc.params, got.params, "params CIDs of rounds 0..%d", pinRounds)
			require.Equal(t, pinnedLoopHeads[tc.name], got.heads, "head CIDs of rounds 0..%d", pinRounds)
		})
	}
}

// loopsOf are the loops the node's modules make, made from e (for tests that run the
// loops without the fx graph): head sync, announcer, watcher (stop ends the run) and the
// roles of e's config.
func loopsOf(t *testing.T, e *env, log *slog.Logger, stop func()) []loop {
	self, err := peer.Decode(e.self)
	require.NoError(t, err)
	out := []loop{&headsLoop{env: e}, &announcer{env: e, started: time.Now().UnixMilli()}, &watcher{env: e, stop: stop}}
	if e.cfg.Experiment.HasRole(config.RoleValidator) {
		out = append(out, newValidatorRole(validatorDeps{Cfg: e.cfg, Log: log, Self: self, Key: e.key, Validators: e.validators,
			Bus: e.bus, Tips: e.tips, Heads: e.heads, Store: e.store, Runtime: e.rt, FetchHead: e.fetchHeadArtifacts,
			Keeper: e.keeper, Status: e.status, Metrics: e.metrics}))
	}
	if e.cfg.Experiment.HasRole(config.RoleTrainer) {
		out = append(out, newTrainerRole(trainerDeps{Cfg: e.cfg, Log: log, Self: self, Validators: e.validators,
			Bus: e.bus, Tips: e.tips, Heads: e.heads, Wrap: e.wrapWork, Keeper: e.keeper, Status: e.status, Metrics: e.metrics}))
	}
	return out
}
