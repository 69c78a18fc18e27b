package node

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/dataset"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/internal/testenv"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/round"
	"github.com/p2pnode/p2pnode/synth"
	"github.com/p2pnode/p2pnode/trainer"
)

// The head CIDs of a short synthetic run are pinned here so that moving the role loops out
// of node/ (issue 14) can show it changed nothing: same config, same dataset, same keys,
// same clock give the same heads, bit for bit. One validator and three fixed-key trainers
// train the synthetic workload for pinRounds rounds, and two tests must both make these
// heads:
//
//   - TestPinnedLoopsRunHeads (pin_loops_test.go) runs the role loops themselves (runLoops)
//     on a fake clock (testing/synctest), so every lease expiry, which each head records
//     through its lease ids, is the same in every run. A mocknet cluster cannot be pinned:
//     who gets which lease, and when, depend on timing.
//   - TestPinnedRunHeads (below) plays the leader and the trainers by hand, in a fixed
//     order, through the functions the loops call: mergePolicy, loadData, round.Genesis,
//     the grant's lease plan (lease.AbsorbTail, AssignWithin, Steps, WindowSteps, seeded by the base's
//     parameters), trainer.Seed, round.Trainer, chain.Store.RecentMerges, round.OnProbation
//     and round.Sole, round.Merger. It needs neither the loops nor the fake clock, and
//     names what the loops must do to make these heads.
//
// A deliberate change of a record's format, of the merge arithmetic, of a seed or of the
// leader's timing (its first grant, lease.first_deadline) changes these CIDs: update them
// in a commit of its own that says why.
var pinnedRuns = []struct {
	name, policy, codec string
	// heads are the CIDs of rounds 0 (genesis) to pinRounds; params their parameter
	// artifacts.
	heads, params []string
}{
	{name: "diloco-fp32", policy: "diloco", codec: "fp32",
		heads: []string{
			"bafireidfek3tmdbs7jgi5s4v4ehmma4r725xr3huxl7zxh7xmhznm33fz4",
			"bafireicfcjtigcgeullvze54knlomvwjsvytjl7tfpcibsapjclxbkwpim",
			"bafireieieikiw3dl3s23mie3x6fko75er266tnxdugmec7jmjgauntkzoy",
			"bafireibzumxtgmaniqidv7y7awdhimn7w7wsqt5vz36itwmhzbj646jfda",
			"bafireid7a665qgmgrvfhsni275a3gprb6tgzbdu46vjw45fewoymv5hxnq",
		},
		params: []string{
			"bafireibc24op3chpht2iaycfdj4sg2ac5i2ddiv3xhri7lfvffr5jcleve",
			"bafireihkguyv2u2rpkl3nn2ogfqxxcjiwtttr2t3tajjdqmc2oaa25y6pe",
			"bafireib4bqfnwvod2dcqjd52f2zwmpqahdx7a4hdmh6nj3wmfesfwvj7za",
			"bafireiddgrsl4nutit3wnphytj5ijr2peducplvj3fvkvmpzdxn3rrf2ri",
			"bafireia4t2ieraw3bbbzmf544ypin2bvv32aqes6tthjid4nswwbqn2kmi",
		}},
	{name: "ema-int8", policy: "ema", codec: "int8",
		heads: []string{
			"bafireih6qdvplzexxegw3aflmsvjkcni3pqg72ubajlprqk4mwj4d6omy4",
			"bafireibsmnmywqqxnnloeg5wlphgt5sx3zjv5hh5pscvtioujtub5lxsdm",
			"bafireietvsvpwxaqmfkafkqbc7qrgb5nak5uy25zb6b7rbzeek4g3zjqxa",
			"bafireifvp4bclhbj2zla74o6wkswtstzlt4a55tsfzxlryd26j6qnn5nsu",
			"bafireidiuksog2352bjt2ndmu3nageym43m4rn4vgnrqmvwa7vbfiexbia",
		},
		params: []string{
			"bafireibc24op3chpht2iaycfdj4sg2ac5i2ddiv3xhri7lfvffr5jcleve",
			"bafireighudjr5pq3wgwng6nocxo34sacjrt6mej4oc2w72phe6wgs2rr6m",
			"bafireiguhvcb36pnouqwr3l7sby46q667cyd3i3ifb2dcw56h2queii3gy",
			"bafireif6uprhg5dt4a376lejwogtatshif7qixwapk67oxbo7vrwsmstke",
			"bafireihso6rkpq7xfd4ts2dx3mwg2yiisljqwj4cj7nxwpl5l3dmg2ww6y",
		}},
	{name: "diloco-sparse", policy: "diloco", codec: "sparse",
		heads: []string{
			"bafireibyhbk43rfsim74j6ew7rhk4hh6atosma3fgrkhlofsjl5474xhq4",
			"bafireif5qvbcrjx73chbp3t7kjwbaopfklkjx3mjxlgp2zb77si27cmmqe",
			"bafireicwoulbuzyzsqy33uk6gdptkjd5b7o4sxvdbg7hriwcr34hf2wmt4",
			"bafireihha3vjaq3bva6ydtcqiayw366vdbhz32rkprjp3jyudojmrmk7la",
			"bafireiannc6fjt5m47tdcpxyzcqnaun6vr6zcz232qzwl4a5ped3ijkm74",
		},
		params: []string{
			"bafireibc24op3chpht2iaycfdj4sg2ac5i2ddiv3xhri7lfvffr5jcleve",
			"bafireiavbodgcg5ym5x4cjyjk6lpdpxy4iy6laipzlxvg6iw4tki2rcjmq",
			"bafireicrmexitw75pcnrvzxcj6v4gxnqdveimd3klzx4eg4y73y6e7jxl4",
			"bafireigc76j2l27tc73loaak4yw7upjbmeh6ybkp5j3m7augvamjyam2fy",
			"bafireig42jfwlghxslnng37nwjwxbyvy6goh4otqzzviu2jv5ncxvewktq",
		}},
}

const (
	pinRounds   = 4
	pinShards   = 10 // 3 trainers × 2 microshards: round 2 ends the first epoch short
	pinTrainers = 3
)

// pinExpiry is every lease's expiry in the pinned run: the instant the role loops choose
// in runPinnedLoops, whose fake clock starts at synctest's epoch (2000-01-01 UTC). Its
// leader grants every round at 2.5 s (the first 250 ms tick after it has heard the fleet
// announce for gossip.AnnounceEvery + 250 ms; the rounds take no fake time), with the deadline
// lease.first_deadline (30 s) as no trainer's pace is known yet.
var pinExpiry = time.Date(2000, 1, 1, 0, 0, 32, 500*int(time.Millisecond), time.UTC).UnixMilli()

// pinConfig writes the pinned run's dataset under dir and returns its config.
func pinConfig(t *testing.T, dir, policyKind, codec string) *config.Config {
	t.Helper()
	data := filepath.Join(dir, "data")
	require.NoError(t, synth.WriteDataset(data, pinShards, 1))
	m, err := dataset.Build(data, "synth", 1<<20)
	require.NoError(t, err)
	require.NoError(t, m.Write(filepath.Join(data, dataset.ManifestFile)))

	cfg := config.Default()
	cfg.Node.StoreDir = filepath.Join(dir, "store")
	cfg.Experiment.ID = "pin"
	cfg.Dataset.Root = data
	cfg.Dataset.Manifest = filepath.Join(data, dataset.ManifestFile)
	cfg.Dataset.Prepare = false
	cfg.Dataset.MicroshardBytes = 256
	cfg.Protocol.MergePolicy = policyKind
	cfg.Protocol.Codec = diloco.Codec(codec)
	cfg.Protocol.InnerSteps = 10
	cfg.Protocol.DiLoCo = config.DiLoCo{OuterLR: 0.7, Momentum: 0.9, Nesterov: true}
	cfg.Protocol.EMA.NewWeight = 0.5
	if codec == "sparse" {
		cfg.Protocol.SparseBlock, cfg.Protocol.SparseTopK = 64, 8
		// The pins are of the codec at a fixed top-k; round's tests cover the warm-up.
		cfg.Protocol.SparseWarmupRounds = 0
		cfg.Protocol.DiLoCo.Momentum = 0 // SparseLoCo's choice (config allows at most 0.5)
	}
	cfg.Lease.MicroshardsPerTrainer = 2
	require.NoError(t, cfg.Validate())
	return cfg
}

// pinnedRun is the outcome of one run: head and params CIDs by round.
type pinnedRun struct {
	heads, params, outer []string
	merged               [][]string // peers merged per round
}

func runPinned(t *testing.T, policyKind, codec string, workers int) pinnedRun {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	cfg := pinConfig(t, dir, policyKind, codec)

	log := slog.New(slog.DiscardHandler)
	store, err := artifact.OpenStore(filepath.Join(dir, "artifacts"), artifact.Options{ChunkSize: cfg.Node.ChunkSize})
	require.NoError(t, err)
	heads, err := chain.OpenStore(filepath.Join(dir, "heads"))
	require.NoError(t, err)
	ds, err := loadData(ctx, cfg, runtimeOptions(cfg, log), store, nil, nil, log)
	require.NoError(t, err)
	policy, err := mergePolicy(cfg)
	require.NoError(t, err)
	vkey, vid := testenv.Key(t, "validator")

	// Genesis as the first validator makes it (ensureGenesis).
	rt := synth.New(filepath.Join(dir, "genesis"))
	_, err = rt.Start(ctx)
	require.NoError(t, err)
	initPack := filepath.Join(rt.ScratchDir(), "genesis.safetensors")
	require.NoError(t, rt.Init(ctx, cfg.Experiment.Seed, initPack))
	base, baseID, err := round.Genesis(store, initPack, cfg.Experiment.Network, cfg.Experiment.ID, ds.planID, len(ds.plan.Shards), policy)
	require.NoError(t, err)

	var run pinnedRun
	record := func(id cid.Cid, h *chain.Head) {
		b, err := h.Encode()
		require.NoError(t, err)
		sig, err := chain.Sign(vkey, id)
		require.NoError(t, err)
		_, err = heads.Put(&chain.SignedHead{Head: b, Sigs: []chain.Signature{sig}})
		require.NoError(t, err)
		pid, err := h.ParamsID()
		require.NoError(t, err)
		oid, err := h.OuterStateID()
		require.NoError(t, err)
		run.heads, run.params = append(run.heads, id.String()), append(run.params, pid.String())
		outer := ""
		if oid.Defined() {
			outer = oid.String()
		}
		run.outer = append(run.outer, outer)
	}
	record(baseID, base)

	// Trainers as start-up makes them, each with its own worker (and residual).
	trainers := map[string]*round.Trainer{}
	var peers []string
	for i := range pinTrainers {
		_, id := testenv.Key(t, fmt.Sprintf("trainer-%d", i))
		wrt := synth.New(filepath.Join(dir, "trainer", id))
		_, err := wrt.Start(ctx)
		require.NoError(t, err)
		trainers[id] = &round.Trainer{Runtime: wrt, Store: store, Shards: ds, Codec: policy.Codec,
			Int8Block: policy.Int8Block, Sparse: policy.Sparse, Workers: workers}
		peers = append(peers, id)
	}
	sort.Strings(peers)
	merger := &round.Merger{Store: store, Policy: policy, Workers: workers}

	for r := uint64(1); r <= pinRounds; r++ {
		const attempt = 0
		// The leader's grant (validator/leader_issue.go): the plan over the available microshards, seeded
		// by the base's parameters, the round and the attempt.
		// The whole chain so far: shorter than the validator's window of 64 heads.
		_, merges := heads.RecentMerges(baseID, pinRounds+1)
		// No trainer's capacity is measured: every one gets inner_steps and the same share.
		var work []lease.Trainer
		for _, p := range peers {
			work = append(work, lease.Trainer{Peer: p, Proven: merges[p] > 0})
		}
		seed := append(slices.Clone(base.Params), byte(base.Round), byte(base.Round>>8), byte(attempt), byte(attempt>>8))
		avail := lease.Available(base.Ledger)
		share := lease.AbsorbTail(len(avail), work, cfg.Lease.MicroshardsPerTrainer)
		plan := lease.AssignWithin(avail, work, share, lease.MaxRoundMicroshards, seed)
		steps := lease.WindowSteps(lease.Steps(work, cfg.Protocol.InnerSteps), plan, work, cfg.Lease.MicroshardsPerTrainer)

		var cands []round.Candidate
		for _, p := range peers {
			if len(plan[p]) == 0 {
				continue
			}
			l := lease.Lease{Round: r, Base: baseID.Bytes(), Trainer: p, Microshards: plan[p],
				Expiry: pinExpiry, Issuer: vid, Epoch: base.Ledger.Epoch, Steps: uint32(steps[p])}
			require.NoError(t, l.Check(baseID, base), "round %d lease of %s", r, p)
			res, err := trainers[p].Train(ctx, base, l.Microshards, int(l.Steps), trainer.Seed(cfg.Experiment.Seed, r, attempt, p))
			require.NoError(t, err, "round %d trainer %s", r, p)
			cands = append(cands, round.Candidate{Peer: p, Delta: res.Delta, Lease: l.ID(), Samples: res.Samples,
				Microshards: l.Microshards, Loss: res.Loss, Probation: round.OnProbation(merges, p),
				Sole: round.Sole(merges, p)})
		}
		// Candidates reach the leader in any order; the merge sorts them by peer.
		slices.Reverse(cands)
		out, err := merger.Merge(ctx, baseID, base, cands)
		require.NoError(t, err, "round %d", r)
		require.Empty(t, out.Rejected, "round %d: an honest run merges every contribution", r)
		var merged []string
		for _, c := range out.Head.Contributions {
			merged = append(merged, fmt.Sprintf("%s…%v", c.Peer[len(c.Peer)-4:], c.Microshards))
		}
		merged = append(merged, fmt.Sprintf("epoch %d", out.Head.Ledger.Epoch))
		run.merged = append(run.merged, merged)
		record(out.ID, out.Head)
		base, baseID = out.Head, out.ID
	}
	return run
}

func TestPinnedRunHeads(t *testing.T) {
	for _, tc := range pinnedRuns {
		t.Run(tc.name, func(t *testing.T) {
			got := runPinned(t, tc.policy, tc.codec, 0)
			t.Logf("heads:  %q", got.heads)
			t.Logf("params: %q", got.params)
			t.Logf("merged: %v", got.merged)
			// The worker count must not change a bit of any merge (nor of a trainer's
			// encoding): a validator recomputes what another merged with other cores.
			one := runPinned(t, tc.policy, tc.codec, 1)
			require.Equal(t, got, one, "workers 1 against the default")
			require.Equal(t, tc.heads, got.heads, "head CIDs of rounds 0..%d", pinRounds)
			require.Equal(t, tc.params, got.params, "params CIDs of rounds 0..%d", pinRounds)
		})
	}
}
