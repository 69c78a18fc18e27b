package node

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/internal/progress"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/synth"
)

// cluster is an in-process swarm on mocknet with the synthetic workload.
type cluster struct {
	t     *testing.T
	mn    mocknet.Mocknet
	dir   string
	nodes []*clusterNode
	// keySalt varies the peer keys: clusters that run at the same time in one process need
	// distinct peer ids (announcements of one reached the other's validator as a restart).
	keySalt byte
}

type clusterNode struct {
	name string
	cfg  *config.Config
	host host.Host
	rt   *synth.Runtime
	n    *Node
	err  chan error
	out  *syncBuffer
	stop context.CancelFunc
	// logs, when set, receives the node's log lines (text, info and up).
	logs *syncBuffer
	// extra options join the node's fx graph (a test attacker decorates its bus).
	extra []fx.Option
	// work, when set, is shown the node's long work (Options.Work).
	work progress.Tracker
}

// newCluster makes validators+trainers hosts on a fully connected mocknet and their configs.
func newCluster(t *testing.T, validators, trainers, rounds int, shards int) *cluster {
	return newClusterSorted(t, validators, trainers, rounds, shards, validators+trainers)
}

// newClusterSorted is newCluster where the nodes from index sortLast on get peer ids that
// sort after those of every node before sortLast: lease assignment goes in peer order, so
// extra trainers sorted last leave the others' leases as they would be without them. (Not
// after each other's: Ed25519 peer ids have a greatest value, and a search for each one
// past the last, a record past a record, needed 85, 1970, then more than 65536 keys for
// the one-third matrix's alie row (salt 12), whose key search then looped forever.)
func newClusterSorted(t *testing.T, validators, trainers, rounds int, shards int, sortLast int) *cluster {
	t.Helper()
	return newClusterSalted(t, 0, validators, trainers, rounds, shards, sortLast)
}

// newClusterSalted is newClusterSorted with peer keys varied by salt (0: newClusterSorted's).
func newClusterSalted(t *testing.T, salt byte, validators, trainers, rounds int, shards int, sortLast int) *cluster {
	t.Helper()
	c := &cluster{t: t, mn: mocknet.New(), dir: t.TempDir(), keySalt: salt}
	t.Cleanup(func() { c.mn.Close() })
	synthDataset(t, filepath.Join(c.dir, "data"), shards)
	var vids []string
	maxID := ""
	for i := 0; i < validators+trainers; i++ {
		after := ""
		if i >= sortLast {
			after = maxID
		}
		h := c.addPeer(i, after)
		if i < sortLast {
			maxID = max(maxID, h.ID().String())
		}
		name := fmt.Sprintf("trainer-%d", i-validators)
		if i < validators {
			name = fmt.Sprintf("validator-%d", i)
			vids = append(vids, h.ID().String())
		}
		cfg := soloConfig(t, c.dir, rounds)
		cfg.Node.StoreDir = filepath.Join(c.dir, name)
		cfg.Node.HTTP = "off"
		cfg.Experiment.Roles = []string{config.RoleTrainer}
		if i < validators {
			cfg.Experiment.Roles = []string{config.RoleValidator}
		}
		c.nodes = append(c.nodes, &clusterNode{name: name, cfg: cfg, host: h, rt: synth.New(filepath.Join(c.dir, name, "scratch")), out: &syncBuffer{}})
	}
	for _, n := range c.nodes {
		n.cfg.Experiment.Validators = vids
		n.cfg.Experiment.Quorum = len(vids)/2 + 1 // a majority, as config requires
		require.NoError(t, n.cfg.Validate())
	}
	require.NoError(t, c.mn.LinkAll())
	return c
}

// addPeer adds a mocknet host with an Ed25519 key, like the node's own identities (peer
// ids that embed the public key, so head signatures verify offline).
func (c *cluster) addPeer(i int, after string) host.Host {
	c.t.Helper()
	// Keys derive from the node's index, so two clusters built alike have the same peer ids
	// (and the same lease assignments): runs can be compared.
	var sk crypto.PrivKey
	for k := 0; ; k++ {
		if k == 1<<16 {
			// The seed holds k in two bytes: past them the search would repeat itself.
			c.t.Fatalf("node %d: no peer id after %s in %d keys", i, after, k)
		}
		seed := make([]byte, 64)
		seed[0], seed[1], seed[2], seed[3], seed[4] = byte(i), byte(i>>8), byte(k), byte(k>>8), c.keySalt
		key, _, err := crypto.GenerateEd25519Key(bytes.NewReader(seed))
		require.NoError(c.t, err)
		id, err := peer.IDFromPrivateKey(key)
		require.NoError(c.t, err)
		if id.String() > after {
			sk = key
			break
		}
	}
	h, err := c.mn.AddPeer(sk, ma.StringCast(fmt.Sprintf("/ip4/10.0.%d.%d/tcp/4001", i/250, i%250+1)))
	require.NoError(c.t, err)
	return h
}

func (c *cluster) start(n *clusterNode) {
	c.t.Helper()
	log := testLogger(c.t, n.name)
	if n.logs != nil {
		log = slog.New(slog.NewTextHandler(n.logs, nil)).With("node", n.name)
	}
	// The host outlives a node that stopped, and a stopped GossipSub leaves its protocol
	// handlers set: the wait below would take them for the new node's and connect before
	// its GossipSub runs (peers half-attached, announcements lost: a restarted trainer's
	// round closed a minute late in CI).
	for _, id := range n.host.Mux().Protocols() {
		if strings.HasPrefix(string(id), "/meshsub/") || strings.HasPrefix(string(id), "/floodsub/") {
			n.host.RemoveStreamHandler(id)
		}
	}
	node, err := newNode(n.cfg, Options{Progress: n.out, Runtime: n.rt, Host: n.host, Logger: log, Work: n.work}, n.extra...)
	require.NoError(c.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	n.n, n.stop, n.err = node, cancel, make(chan error, 1)
	go func() { n.err <- node.Run(ctx) }()
	// Connect only once the node's GossipSub runs (its protocol handler is set): it attaches
	// to connections it sees open, so peers connected before it started would stay
	// half-attached.
	require.Eventually(c.t, func() bool { return slices.Contains(n.host.Mux().Protocols(), pubsub.GossipSubID_v11) },
		10*time.Second, 2*time.Millisecond, "%s: GossipSub never started", n.name)
	for _, o := range c.nodes {
		if o != n && o.n != nil {
			_, _ = c.mn.ConnectPeers(n.host.ID(), o.host.ID())
		}
	}
}

func (c *cluster) startAll() {
	for _, n := range c.nodes {
		c.start(n)
	}
}

// waitDone waits for every node to finish its rounds.
func (c *cluster) waitDone(timeout time.Duration) { c.waitDoneOf(c.nodes, timeout) }

// waitDoneOf waits for the given nodes to finish their rounds.
func (c *cluster) waitDoneOf(nodes []*clusterNode, timeout time.Duration) {
	c.t.Helper()
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func(n *clusterNode) {
			defer wg.Done()
			select {
			case err := <-n.err:
				require.NoError(c.t, err, n.name)
			case <-time.After(timeout):
				c.t.Errorf("%s did not finish within %s (round %d)", n.name, timeout, n.n.Status().Round)
				n.stop()
			}
		}(n)
	}
	wg.Wait()
}

func TestMocknetClusterAgreesOnEveryHead(t *testing.T) {
	c := newCluster(t, 1, 4, 5, 40)
	for _, n := range c.nodes {
		n.cfg.Lease.MinGroup = 4 // lease only once every trainer is up, so all four contribute
	}
	c.startAll()
	c.waitDone(2 * time.Minute)
	ref := c.nodes[0].n.Status()
	require.Equal(t, uint64(5), ref.Round)
	for _, n := range c.nodes {
		st := n.n.Status()
		require.Equal(t, ref.Head, st.Head, "%s holds another head", n.name)
		stores, err := OpenStores(n.cfg)
		require.NoError(t, err)
		ids, heads, err := stores.Heads.Chain(mustDecode(t, st.Head))
		require.NoError(t, err, n.name)
		require.Len(t, ids, 6)
		for i, h := range heads {
			require.Equal(t, uint64(i), h.Round, "%s: rounds are consecutive", n.name)
		}
		refIDs, _, _ := func() ([]string, int, error) {
			s, _ := OpenStores(c.nodes[0].cfg)
			x, _, err := s.Heads.Chain(mustDecode(t, ref.Head))
			out := make([]string, len(x))
			for i, id := range x {
				out[i] = id.String()
			}
			return out, 0, err
		}()
		for i, id := range ids {
			require.Equal(t, refIDs[i], id.String(), "%s: head chains differ at round %d", n.name, i)
		}
	}
	// Every trainer contributed, and the validator merged everyone in most rounds.
	stores, _ := OpenStores(c.nodes[0].cfg)
	_, heads, _ := stores.Heads.Chain(mustDecode(t, ref.Head))
	contributors := map[string]bool{}
	for _, h := range heads[1:] {
		for _, ct := range h.Contributions {
			contributors[ct.Peer] = true
		}
	}
	require.Len(t, contributors, 4)
	rep, err := stores.Audit(mustDecode(t, ref.Head))
	require.NoError(t, err)
	require.Zero(t, rep.Duplicated)

	// Trainers fetch the parameters they train on, never the validators' outer momentum.
	outer, err := heads[len(heads)-1].OuterStateID()
	require.NoError(t, err)
	require.True(t, outer.Defined())
	for _, n := range c.nodes {
		s, err := OpenStores(n.cfg)
		require.NoError(t, err)
		require.Equal(t, n.cfg.Experiment.HasRole(config.RoleValidator), s.Artifacts.Has(outer),
			"%s (roles %v) holds the outer state: %v", n.name, n.cfg.Experiment.Roles, s.Artifacts.Has(outer))
	}
}

// kill stops a node abruptly: its loops end and its connections drop (its store stays).
func (c *cluster) kill(n *clusterNode) {
	c.t.Helper()
	n.stop()
	<-n.err
	for _, o := range c.nodes {
		if o != n {
			_ = c.mn.UnlinkPeers(n.host.ID(), o.host.ID())
			_ = c.mn.DisconnectPeers(n.host.ID(), o.host.ID())
		}
	}
}

// restart brings a killed node back on the same host and store.
func (c *cluster) restart(n *clusterNode) {
	c.t.Helper()
	for _, o := range c.nodes {
		if o != n {
			_, _ = c.mn.LinkPeers(n.host.ID(), o.host.ID())
		}
	}
	lr, delay, step := n.rt.LR, n.rt.Delay, n.rt.StepSeconds
	n.rt = synth.New(n.rt.ScratchDir())
	n.rt.LR, n.rt.Delay, n.rt.StepSeconds = lr, delay, step
	c.start(n)
}

// partition cuts every link between the two sides.
func (c *cluster) partition(a, b []*clusterNode) {
	// cut resets every stream between x and y before closing their connections: closing a
	// mocknet connection does not always end the streams on it, and a long-lived pubsub
	// stream that survives would carry gossip across the partition.
	cut := func(x, y *clusterNode) bool {
		found := false
		for _, pair := range [][2]*clusterNode{{x, y}, {y, x}} {
			for _, conn := range pair[0].host.Network().ConnsToPeer(pair[1].host.ID()) {
				found = true
				for _, st := range conn.GetStreams() {
					_ = st.Reset()
				}
				_ = conn.Close()
			}
		}
		_ = c.mn.DisconnectPeers(x.host.ID(), y.host.ID())
		return found
	}
	for _, x := range a {
		for _, y := range b {
			_ = c.mn.UnlinkPeers(x.host.ID(), y.host.ID())
			cut(x, y)
		}
	}
	// A dial that passed mocknet's link check just before the unlink (a stream opened to
	// fetch an artifact, say) can still complete: cut such connections until none is
	// left, so that the two sides really are cut off from each other.
	crossed := func() bool {
		any := false
		for _, x := range a {
			for _, y := range b {
				any = cut(x, y) || any
			}
		}
		return any
	}
	for quiet := 0; quiet < 10; {
		if crossed() {
			quiet = 0
		} else {
			quiet++
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitAnnounced waits until every node of ns has heard every other one announce: their
// announcers run, so a node started next hears them all within an announcement period.
func (c *cluster) waitAnnounced(ns []*clusterNode) {
	c.t.Helper()
	require.Eventually(c.t, func() bool {
		for _, a := range ns {
			heard := map[string]bool{}
			for _, p := range a.n.Status().Peers {
				heard[p.Peer] = !p.LastSeen.IsZero()
			}
			for _, b := range ns {
				if b != a && !heard[b.host.ID().String()] {
					return false
				}
			}
		}
		return true
	}, time.Minute, 20*time.Millisecond, "the nodes never heard each other announce")
}

// heal links and connects everyone again.
func (c *cluster) heal() {
	require.NoError(c.t, c.mn.LinkAll())
	require.NoError(c.t, c.mn.ConnectAllButSelf())
}

func leadersFor(validators []string, head cid.Cid) []string { return lease.Leaders(validators, head) }

// useSparse puts a cluster node on the sparse codec, with blocks small enough for the
// synthetic model and the outer momentum the codec allows.
func useSparse(cfg *config.Config) {
	cfg.Protocol.Codec = "sparse"
	cfg.Protocol.SparseBlock, cfg.Protocol.SparseTopK = 64, 4
	cfg.Protocol.DiLoCo.Momentum = 0.5
}

// On the sparse codec a trainer rebuilds every head after the one it joined on from the
// parent and the round's contributions, as the validators computed it, instead of
// downloading the dense parameters: its store ends with the kept heads' parameters
// (node.keep_heads) and the tip's outer state, the next rebuild's start, and its log says
// it rebuilt every head.
func TestMocknetSparseTrainersRebuildHeads(t *testing.T) {
	c := newCluster(t, 1, 3, 4, 40)
	for _, n := range c.nodes {
		useSparse(n.cfg)
		n.cfg.Lease.MinGroup = 3
		n.logs = &syncBuffer{}
		require.NoError(t, n.cfg.Validate())
	}
	c.startAll()
	c.waitDone(2 * time.Minute)
	ref := c.nodes[0].n.Status()
	require.Equal(t, uint64(4), ref.Round)
	vs, err := OpenStores(c.nodes[0].cfg)
	require.NoError(t, err)
	_, heads, err := vs.Heads.Chain(mustDecode(t, ref.Head))
	require.NoError(t, err)
	for _, n := range c.nodes[1:] {
		require.Equal(t, ref.Head, n.n.Status().Head, n.name)
		s, err := OpenStores(n.cfg)
		require.NoError(t, err)
		for _, h := range heads[len(heads)-n.cfg.Node.KeepHeads:] {
			id, err := h.ParamsID()
			require.NoError(t, err)
			require.NoError(t, s.Artifacts.Verify(id), "%s round %d's parameters", n.name, h.Round)
		}
		tip := heads[len(heads)-1]
		id, err := tip.OuterStateID()
		require.NoError(t, err)
		require.NoError(t, s.Artifacts.Verify(id), "%s round %d's outer state", n.name, tip.Round)
		rebuilt := strings.Count(n.logs.String(), "rebuilt head from its contributions")
		require.GreaterOrEqual(t, rebuilt, 3, "%s rebuilt %d of 4 heads:\n%s", n.name, rebuilt, n.logs.String())
		require.NotContains(t, n.logs.String(), "rebuild failed")
	}
}

// A node that joins with an empty store, after several rounds, shows the whole history: the
// held-out metrics and time split of the rounds it missed come with the chain it synced
// (the round notes beside each head), while what only a node that was there could measure
// (time between heads) is absent for them. With evaluations slower than the rounds, the
// heads it syncs have not been evaluated yet: their metrics come with the proposals that
// follow (gossip.Head.Earlier) and complete the history already recorded.
func TestFreshNodeShowsTheHistoryOfTheChainItSynced(t *testing.T) {
	for _, tc := range []struct {
		name string
		eval time.Duration
	}{
		{"evaluations as fast as rounds", 0},
		{"evaluations slower than rounds", 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) { freshNodeHistory(t, tc.eval) })
	}
}

func freshNodeHistory(t *testing.T, eval time.Duration) {
	const rounds = 6
	c := newCluster(t, 1, 2, rounds, 20)
	for i, n := range c.nodes {
		n.cfg.Lease.MinGroup = 1
		// Only validators evaluate: the trainers' eval_every is 0, as `p2pnode demo` writes
		// it, and the leader's notes say when metrics follow.
		n.cfg.Experiment.EvalEvery = 0
		if i == 0 {
			n.cfg.Experiment.EvalEvery = 1
		}
	}
	c.nodes[0].rt.EvalHook = func(m map[string]float64) map[string]float64 {
		time.Sleep(eval)
		return m
	}
	late := c.nodes[2]
	c.start(c.nodes[0])
	c.start(c.nodes[1])
	require.Eventually(t, func() bool { return c.nodes[0].n.Status().Round >= 3 }, time.Minute, 50*time.Millisecond)
	c.start(late)
	c.waitDone(2 * time.Minute)
	c.requireOneChain(c.nodes, rounds)

	ref := c.nodes[0].n.Status().History
	st := late.n.Status()
	require.Len(t, st.History, rounds+1)
	missed := 0
	for i, p := range st.History {
		require.Equal(t, uint64(i), p.Round)
		require.Equal(t, ref[i].Head, p.Head)
		require.Contains(t, p.HeldOut, "mse", "round %d", i)
		require.Equal(t, ref[i].HeldOut, p.HeldOut, "round %d", i)
		require.Equal(t, ref[i].Merged, p.Merged, "round %d", i)
		require.Equal(t, ref[i].Time, p.Time, "round %d", i)
		if i > 0 {
			require.NotNil(t, p.Time, "round %d", i)
		}
		if p.Seconds == 0 && p.BytesIn == 0 {
			missed++
		}
	}
	require.GreaterOrEqual(t, missed, 3, "the rounds before it joined carry no local measurements")
	// The rounds it followed, the trainer that was there from the start too, printed their
	// held-out metrics with their progress lines.
	for _, n := range c.nodes[1:] {
		lines := regexp.MustCompile(`(?m)^round +\d+/6 .*$`).FindAllString(n.out.String(), -1)
		require.NotEmpty(t, lines, n.name)
		for _, l := range lines {
			require.Contains(t, l, "held-out mse", "%s: %s", n.name, n.out.String())
		}
	}
}
