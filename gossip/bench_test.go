package gossip

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/stretchr/testify/require"
)

// BenchmarkGossip measures how fast a validator's heads reach a 50-node swarm connected
// as a sparse random graph (each node dials about 8 others), after the GossipSub meshes
// have formed: heads spaced 30 ms apart (p50/p99 time until ALL 49 other nodes have one),
// then a burst of 100 heads published back to back (how many reached everyone, and p99).
//
//	go test -run '^$' -bench Gossip -benchtime 1x -count 3 ./gossip/
func BenchmarkGossip(b *testing.B) {
	const (
		nodes   = 50
		degree  = 8
		spaced  = 100
		spacing = 30 * time.Millisecond
		burst   = 100
	)
	for b.Loop() {
		sw := newSwarm(b, nodes, degree)
		sw.warmUp(b)
		head := sw.head(b, 1)
		b.ReportMetric(float64(len(encode(b, head))), "head-bytes")

		lat, delivered := sw.run(b, spaced, 1, spacing)
		require.Equal(b, spaced, delivered, "spaced heads must all reach every node")
		b.ReportMetric(ms(pct(lat, 50)), "p50-ms")
		b.ReportMetric(ms(pct(lat, 99)), "p99-ms")

		cpu := busyCPU()
		lat, delivered = sw.run(b, burst, 1+spaced, 0)
		cpu = busyCPU() - cpu
		b.ReportMetric(float64(delivered), "burst-delivered")
		// All 50 nodes share this machine's cores, so the burst is CPU-bound here: this is
		// what one node spends per message, i.e. what a burst would cost a real node.
		b.ReportMetric(cpu.Seconds()*1e6/float64(burst*nodes), "burst-cpu-µs/msg/node")
		b.ReportMetric(ms(pct(lat, 50)), "burst-p50-ms")
		b.ReportMetric(ms(pct(lat, 99)), "burst-p99-ms")
		b.ReportMetric(sw.dropped(b), "dropped")
	}
}

type swarm struct {
	nodes []*node
	mesh  []*meshTracer
	val   host.Host

	mu      sync.Mutex
	arrived map[uint64][]time.Time // head round → arrival time at each non-publisher
	done    map[uint64]chan struct{}
}

func newSwarm(b *testing.B, n, degree int) *swarm {
	mn, hosts := newMocknet(b, n)
	sw := &swarm{val: hosts[0], arrived: map[uint64][]time.Time{}, done: map[uint64]chan struct{}{}}
	sw.mesh = make([]*meshTracer, n)
	for i := range sw.mesh {
		sw.mesh[i] = &meshTracer{}
	}
	i := 0
	sw.nodes = startNodes(b, hosts, []peer.ID{hosts[0].ID()}, func(p *Params) {
		p.PubSubOptions = append(p.PubSubOptions, pubsub.WithRawTracer(sw.mesh[i]))
		i++
	})
	// Dial only once every pubsub is up (see fullMesh).
	for _, e := range sparseGraph(n, degree, rand.New(rand.NewPCG(1, 2))) {
		_, err := mn.LinkPeers(hosts[e[0]].ID(), hosts[e[1]].ID())
		require.NoError(b, err)
		_, err = mn.ConnectPeers(hosts[e[0]].ID(), hosts[e[1]].ID())
		require.NoError(b, err)
	}
	for _, nd := range sw.nodes[1:] {
		go sw.collect(nd)
	}
	go func() { // the publisher's own copies: drained, not timed
		for range sw.nodes[0].Messages() {
		}
	}()
	return sw
}

// sparseGraph links every node to at least degree random others, on top of a ring that
// keeps the graph connected.
func sparseGraph(n, degree int, rng *rand.Rand) [][2]int {
	adj := make([]map[int]bool, n)
	for i := range adj {
		adj[i] = map[int]bool{}
	}
	var edges [][2]int
	add := func(a, c int) {
		if a != c && !adj[a][c] {
			adj[a][c], adj[c][a] = true, true
			edges = append(edges, [2]int{a, c})
		}
	}
	for i := range n {
		add(i, (i+1)%n)
	}
	for i := range n {
		for len(adj[i]) < degree {
			add(i, rng.IntN(n))
		}
	}
	return edges
}

// warmUp waits until every node has a heads mesh as full as its neighbourhood allows and
// two more heartbeats have passed, so timing starts on a settled overlay.
func (sw *swarm) warmUp(b *testing.B) {
	topic := TopicName(testNet, testExp, string(KindHeads))
	require.Eventually(b, func() bool {
		for i, nd := range sw.nodes {
			want := min(pubsub.GossipSubDlo, len(nd.host.Network().Peers()))
			if sw.mesh[i].size(topic) < want {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "meshes did not form")
	time.Sleep(2 * pubsub.GossipSubHeartbeatInterval)
}

func (sw *swarm) head(b *testing.B, round uint64) *Head {
	h, _ := signedHead(b, fixChainHead(round, 4), privKey(b, sw.val))
	return h
}

// run publishes count heads from the validator, spacing apart (0: back to back), and
// returns the time each took to reach every other node, and how many did.
func (sw *swarm) run(b *testing.B, count int, first uint64, spacing time.Duration) ([]time.Duration, int) {
	heads := make([]*Head, count)
	sw.mu.Lock()
	for i := range heads {
		heads[i] = sw.head(b, first+uint64(i)) // signed before timing starts
		sw.done[first+uint64(i)] = make(chan struct{})
	}
	sw.mu.Unlock()
	sent := make([]time.Time, count)
	for i, h := range heads {
		sent[i] = time.Now()
		require.NoError(b, sw.nodes[0].Publish(context.Background(), h))
		if spacing > 0 {
			time.Sleep(spacing)
		}
	}
	var lat []time.Duration
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // for stragglers
	defer cancel()
	for i := range heads {
		select {
		case <-sw.done[first+uint64(i)]:
		case <-ctx.Done():
		}
	}
	sw.mu.Lock()
	defer sw.mu.Unlock()
	for i := range heads {
		at := sw.arrived[first+uint64(i)]
		if len(at) == len(sw.nodes)-1 {
			lat = append(lat, slices.MaxFunc(at, time.Time.Compare).Sub(sent[i]))
		}
	}
	return lat, len(lat)
}

func (sw *swarm) collect(nd *node) {
	for m := range nd.Messages() {
		now := time.Now()
		h, ok := m.Msg.(*Head)
		if !ok {
			continue
		}
		ch, err := h.Signed.Decode()
		if err != nil {
			continue
		}
		sw.mu.Lock()
		sw.arrived[ch.Round] = append(sw.arrived[ch.Round], now)
		if len(sw.arrived[ch.Round]) == len(sw.nodes)-1 {
			close(sw.done[ch.Round])
		}
		sw.mu.Unlock()
	}
}

// dropped sums what pubsub dropped anywhere in the swarm (queues full, slow consumer).
func (sw *swarm) dropped(b *testing.B) float64 {
	by := map[string]float64{}
	defer func() {
		if len(by) > 0 {
			b.Logf("dropped by reason: %v", by)
		}
	}()
	total := 0.0
	for _, nd := range sw.nodes {
		fams, err := nd.reg.Gather()
		if err != nil {
			continue
		}
		for _, f := range fams {
			if f.GetName() == "p2ptrain_gossip_dropped_total" {
				for _, m := range f.GetMetric() {
					total += m.GetCounter().GetValue()
					by[m.GetLabel()[0].GetValue()+"/"+m.GetLabel()[1].GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(float64(p)/100*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// meshTracer follows one node's mesh membership per topic (GRAFT/PRUNE), which pubsub
// does not expose otherwise.
type meshTracer struct {
	noopTracer
	mu   sync.Mutex
	mesh map[string]map[peer.ID]bool
}

func (m *meshTracer) Graft(p peer.ID, topic string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mesh == nil {
		m.mesh = map[string]map[peer.ID]bool{}
	}
	if m.mesh[topic] == nil {
		m.mesh[topic] = map[peer.ID]bool{}
	}
	m.mesh[topic][p] = true
}

func (m *meshTracer) Prune(p peer.ID, topic string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.mesh[topic], p)
}

func (m *meshTracer) size(topic string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.mesh[topic])
}

type noopTracer struct{}

func (noopTracer) OnNewOutboundStream(peer.ID, protocol.ID) {}
func (noopTracer) OnClosedOutboundStream(peer.ID)           {}
func (noopTracer) Join(string)                              {}
func (noopTracer) Leave(string)                             {}
func (noopTracer) Graft(peer.ID, string)                    {}
func (noopTracer) Prune(peer.ID, string)                    {}
func (noopTracer) ValidateMessage(*pubsub.Message)          {}
func (noopTracer) DeliverMessage(*pubsub.Message)           {}
func (noopTracer) RejectMessage(*pubsub.Message, string)    {}
func (noopTracer) DuplicateMessage(*pubsub.Message)         {}
func (noopTracer) ThrottlePeer(peer.ID)                     {}
func (noopTracer) RecvRPC(*pubsub.RPC)                      {}
func (noopTracer) SendRPC(*pubsub.RPC, peer.ID)             {}
func (noopTracer) DropRPC(*pubsub.RPC, peer.ID)             {}
func (noopTracer) UndeliverableMessage(*pubsub.Message)     {}
