package node

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/upkeep"
)

// A trainer that joins on a link so slow that its download of the model (parameters and
// outer state) outlasts several rounds catches up on the sparse codec while the swarm goes
// on without waiting for it: it downloads the anchor head (upkeep.AnchorEvery), which
// holders keep for that many rounds, and rebuilds the heads after it from their
// contributions, which holders keep for as many rounds as fit in one parameter pack. It is
// not leased before it holds a head (a lease it could not train would hold the round).
// Before, it downloaded the tip's artifacts, the tip's outer state or parameters were
// pruned before they came (holders keep the outer state for their tip alone), and each
// next try was rounds behind again until one was lucky (docs/wan.md, "A joiner whose
// download of the model takes longer than a round"); with slower links, never.
func TestSlowJoinerRebuildsTheRoundsItMissed(t *testing.T) {
	const rounds, joinAt = 40, upkeep.AnchorEvery + 1
	c := newCluster(t, 1, 3, rounds, 64)
	late := c.nodes[3]
	late.logs = &syncBuffer{}
	for _, n := range c.nodes {
		n.cfg.Protocol.Codec = diloco.Sparse
		n.cfg.Lease.MinGroup = 2
		n.cfg.Lease.RoundTimeout = 10 * time.Second
		// A parameter pack of 1 MiB (and as much outer state): 2 MiB to download.
		n.rt.Pad = 1 << 18
		// Rounds of 500 ms or more, several of which pass while the joiner downloads.
		n.rt.Delay = 500 * time.Millisecond
		require.NoError(t, n.cfg.Validate())
	}
	for _, n := range c.nodes[:3] {
		c.start(n)
	}
	require.Eventually(t, func() bool { return c.nodes[0].n.Status().Round >= joinAt }, 2*time.Minute, 50*time.Millisecond)
	// Each of the joiner's links carries 640 KiB/s: a pack of 2 chunks in about 1.6 s (one
	// chunk of 1 MiB per holder at a time), the anchor's two in about 3.2 s, against rounds
	// of about 0.6 s; the anchor stays for AnchorEvery - 1 rounds after the joiner starts.
	// A sparse contribution is about 1 % of the pack.
	for _, o := range c.nodes[:3] {
		for _, l := range c.mn.LinksBetweenPeers(late.host.ID(), o.host.ID()) {
			l.SetOptions(mocknet.LinkOptions{Bandwidth: 640 << 10})
		}
	}
	c.start(late)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the joiner's log:\n%s", joinerStory(late.logs.String()))
		}
	})
	c.waitDone(4 * time.Minute)

	heads := c.requireOneChain(c.nodes, rounds)
	lid := late.host.ID().String()
	var merged []uint64
	for _, h := range heads {
		for _, ct := range h.Contributions {
			if ct.Peer == lid {
				merged = append(merged, h.Round)
			}
		}
	}
	logs := late.logs.String()
	t.Logf("joiner: merged in rounds %v, %d heads rebuilt; it said:\n%s", merged, strings.Count(logs, "rebuilt head from its contributions"), joinerStory(logs))
	// It downloaded an anchor past genesis and rebuilt the heads after it — or, where the
	// tip it first asked for was an anchor (a peer a round behind the validator, on a
	// loaded machine), that head itself.
	first := regexp.MustCompile(`msg="caught up" .*? round=(\d+) `).FindStringSubmatch(logs)
	require.NotNil(t, first, "the joiner never caught up")
	r, err := strconv.ParseUint(first[1], 10, 64)
	require.NoError(t, err)
	fromAnchor := regexp.MustCompile(`msg="downloaded the anchor head to rebuild the heads after it" .*anchor=([1-9][0-9]*) `).MatchString(logs)
	require.True(t, fromAnchor || r > 0 && upkeep.IsAnchor(r), "the joiner caught up first to round %d, and not from an anchor past genesis", r)
	require.NotEmpty(t, merged, "the slow joiner is never merged")
	// It was merged 7-8 rounds after it started (quiet machine, two runs); on the code
	// before, which downloaded the tip's artifacts and tried again on the next tip each time
	// they were pruned first, 15 and 19 rounds after (rounds 24 and 28).
	require.LessOrEqual(t, merged[0], uint64(joinAt+12), "the slow joiner is merged late")
	require.NotContains(t, logs, `msg="lease failed"`, "the joiner was leased before it could train")
}

// joinerStory is what a joiner's log says of its catching up.
func joinerStory(logs string) string {
	said := regexp.MustCompile(`msg="(downloaded the anchor|caught up|lease failed|catch-up failed|head not accepted|rebuild failed)`)
	var story []string
	for _, l := range strings.Split(logs, "\n") {
		if said.MatchString(l) {
			story = append(story, l)
		}
	}
	return strings.Join(story, "\n")
}
