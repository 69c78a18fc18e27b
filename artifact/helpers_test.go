package artifact

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// testChunk keeps test artifacts small but many-chunked.
const testChunk = 4 << 10

// testNode is one peer of an in-process cluster with its own store and metrics.
type testNode struct {
	h     host.Host
	store *Store
	x     *Exchange
	reg   *prometheus.Registry
}

func (n *testNode) id() peer.ID { return n.h.ID() }

// metric sums the samples of a counter or histogram (its count) named name whose
// labels include the given name/value pairs.
func (n *testNode) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := n.reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// cluster is a mocknet of n fully linked, connected peers, each with an Exchange.
type cluster struct {
	mn    mocknet.Mocknet
	nodes []*testNode
}

func newCluster(t testing.TB, n int, link mocknet.LinkOptions, opts ExchangeOptions) *cluster {
	t.Helper()
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	mn.SetLinkDefaults(link)
	for range n {
		_, err := mn.GenPeer()
		require.NoError(t, err)
	}
	require.NoError(t, mn.LinkAll())
	require.NoError(t, mn.ConnectAllButSelf())
	c := &cluster{mn: mn}
	for _, h := range mn.Hosts() {
		c.nodes = append(c.nodes, newTestNode(t, h, t.TempDir(), opts))
	}
	return c
}

func newTestNode(t testing.TB, h host.Host, dir string, opts ExchangeOptions) *testNode {
	t.Helper()
	store, err := OpenStore(dir, Options{ChunkSize: testChunk})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	x := NewExchange(h, store, opts)
	t.Cleanup(func() { x.Close() })
	return &testNode{h: h, store: store, x: x, reg: reg}
}

// throttle (re)applies bandwidth to the links between a and b. Setting the options
// also empties mocknet's token bucket, which otherwise grants a full second of
// bandwidth as a burst after an idle second.
func (c *cluster) throttle(a, b *testNode, bytesPerSec float64) {
	for _, l := range c.mn.LinksBetweenPeers(a.id(), b.id()) {
		l.SetOptions(mocknet.LinkOptions{Bandwidth: bytesPerSec})
	}
}

// seed stores data in every given node and returns its artifact id.
func seed(t testing.TB, data []byte, nodes ...*testNode) cid.Cid {
	t.Helper()
	var id cid.Cid
	for _, n := range nodes {
		got, err := n.store.PutBytes(data)
		require.NoError(t, err)
		id = got
	}
	return id
}

// requireStored checks the node holds exactly data under id and no partial state.
func requireStored(t testing.TB, n *testNode, id cid.Cid, data []byte) {
	t.Helper()
	require.True(t, n.store.Has(id))
	require.NoError(t, n.store.Verify(id))
	got, err := n.store.ReadAll(id)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got), "stored bytes differ")
	ents, err := os.ReadDir(filepath.Join(n.store.Dir(), "partial"))
	require.NoError(t, err)
	require.Empty(t, ents, "partial state left behind")
}

// corruptBlob flips a byte in every chunk of a stored artifact, behind the store's back.
func corruptBlob(t testing.TB, n *testNode, id cid.Cid) {
	t.Helper()
	path := n.store.BlobPath(id)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for i := 0; i < len(b); i += testChunk {
		b[i] ^= 0xff
	}
	require.NoError(t, os.Chmod(path, 0o644))
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t testing.TB, timeout time.Duration, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func fetchCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
