package node

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
)

// TestMinorityLeaderWithOneSurvivingLink (issue 12 item 6): three validators (quorum 2)
// and three trainers; the leader of the open round is cut off from every peer but one.
// Through that link its gossip still reaches everyone, so it is heard; but it cannot
// fetch what the others hold, so it may never bring a head to quorum.
//
//   - link to a validator: the leader hears the contributions but can fetch none of them,
//     and leases again pass after pass; its leases and heartbeats kept the others waiting
//     for the whole partition (0 rounds in 30 s). Now the leader hands the round on once a
//     pass has failed that way (every update unavailable), and the next validator takes
//     it over; failing that, the next validator would take it over once the leader has had
//     two round timeouts.
//   - link to a trainer that reaches everyone: the leader can merge that trainer's update
//     and the others can check it, so it may close its round itself, slowly.
//   - link to a trainer cut off from the validators: the leader proposes a head of that
//     trainer's update that no other validator can verify, and waits for a quorum that
//     cannot come while the others go on without it; at the heal it must give that
//     proposal up and follow the chain that did reach quorum.
//
// In every case: the majority side keeps closing rounds during the partition, including
// the rounds the cut-off validator should have led; no round has two heads with a quorum
// of signatures, and no validator signs two heads of one round; after the heal the next
// round closes within two round timeouts, so do the rounds after it, and every node ends
// on one chain.
func TestMinorityLeaderWithOneSurvivingLink(t *testing.T) {
	for _, tc := range []struct {
		name string
		// link is the role of the peer the cut-off leader keeps its link to.
		link string
		// isolateLink also cuts that peer off from the other validators.
		isolateLink bool
		// stuck: the leader is heard but cannot fetch: it must hand the round on, or the
		// others take it over from a leader they still hear.
		stuck bool
		// proposes: the cut-off leader must propose a head that never reaches quorum.
		proposes bool
		// healEarly heals as soon as the cut-off leader has proposed, while its proposal
		// still waits for a quorum, instead of once the others have gone on without it.
		healEarly bool
	}{
		{name: "link to a validator", link: "validator", stuck: true},
		{name: "link to a trainer", link: "trainer"},
		{name: "link to a trainer cut off from the validators", link: "trainer", isolateLink: true, proposes: true},
		{name: "heal while its proposal waits for a quorum", link: "trainer", isolateLink: true, healEarly: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const timeout = 5 * time.Second // lease.round_timeout: "a round deadline"
			c := newCluster(t, 3, 3, 1000, 30)
			for _, n := range c.nodes {
				n.cfg.Experiment.Quorum = 2
				n.cfg.Lease.RoundTimeout = timeout
				n.rt.Delay = time.Second // a round outlasts the cut below, which lands inside it
			}
			validators, trainers := c.nodes[:3], c.nodes[3:]
			for _, n := range c.nodes {
				n.logs = &syncBuffer{}
			}
			t.Cleanup(func() {
				if t.Failed() {
					for _, n := range c.nodes {
						t.Logf("%s:\n%s", n.name, nodeLines(n.logs.String()))
					}
				}
			})
			c.startAll()
			watch := trainers[1]
			require.Eventually(t, func() bool { return watch.n.Status().Round >= 2 }, time.Minute, 20*time.Millisecond)

			// Cut the leader of the open round off from all but one peer.
			st := watch.n.Status()
			victim := c.leaderAfter(st.Head)
			var link *clusterNode
			for _, n := range c.nodes {
				if n != victim && strings.HasPrefix(n.name, tc.link) && n != watch {
					link = n
					break
				}
			}
			var rest, majority []*clusterNode
			for _, n := range c.nodes {
				if n != victim && n != link {
					rest = append(rest, n)
				}
				if n != victim && slices.Contains(validators, n) {
					majority = append(majority, n)
				}
			}
			cutAt := time.Now()
			c.partition([]*clusterNode{victim}, rest)
			if tc.isolateLink {
				c.partition([]*clusterNode{link}, majority)
			}
			cutRound := st.Round
			t.Logf("%s (leader of round %d) keeps one link, to %s", victim.name, cutRound+1, link.name)

			mv := majority[0]
			if tc.healEarly {
				require.Eventually(t, func() bool { return proposedAfter(victim.logs.String(), cutRound) }, time.Minute,
					20*time.Millisecond, "%s proposes with the update of the trainer it still reaches", victim.name)
				t.Logf("%s proposed %.1fs after the cut; healing", victim.name, time.Since(cutAt).Seconds())
			} else {
				// Hold the partition until the majority has closed a round the cut-off
				// validator should have led, and two more.
				var passedOver uint64
				require.Eventually(t, func() bool {
					hist := mv.n.Status().History
					for i := 1; i < len(hist) && passedOver == 0; i++ {
						if r := hist[i].Round; r > cutRound && r == hist[i-1].Round+1 && c.leaderAfter(hist[i-1].Head) == victim {
							passedOver = r
						}
					}
					return passedOver > 0 && len(hist) > 0 && hist[len(hist)-1].Round >= passedOver+2
				}, 2*time.Minute, 200*time.Millisecond, "the majority must go on without %s", victim.name)
				healRound := mv.n.Status().Round
				t.Logf("partition held %.1fs: the majority closed rounds %d..%d (%d), passing over %s at round %d",
					time.Since(cutAt).Seconds(), cutRound+1, healRound, healRound-cutRound, victim.name, passedOver)
			}
			if tc.stuck {
				t.Logf("%s handed its round on: %v", victim.name, handedOn(victim))
				require.True(t, handedOn(victim) || slices.ContainsFunc(majority, func(n *clusterNode) bool { return tookOverHeard(n) }),
					"%s neither handed its round on nor was passed over by a majority validator that still heard it", victim.name)
			}

			// Heal: the next round closes within two round timeouts, the rounds after it go
			// on, and the cut-off validator catches up.
			healRound := mv.n.Status().Round
			c.heal()
			healAt := time.Now()
			require.Eventually(t, func() bool { return mv.n.Status().Round > healRound }, 2*timeout, 20*time.Millisecond,
				"progress resumes within two round timeouts of the heal")
			resumed := time.Since(healAt)
			require.Eventually(t, func() bool { return victim.n.Status().Round >= healRound+3 }, time.Minute, 20*time.Millisecond,
				"%s follows the chain again", victim.name)
			t.Logf("after the heal: round %d closed %.1fs later (round timeout %s); round %d %.1fs later",
				healRound+1, resumed.Seconds(), timeout, healRound+3, time.Since(healAt).Seconds())

			for _, n := range c.nodes {
				n.stop()
				<-n.err
			}
			heads := c.requireConsistentChains(c.nodes)
			minority := c.requireNoConflictingQuorums(2)
			t.Logf("%d heads on one chain; heads proposed that never reached quorum: %v", len(heads), minority)
			if tc.proposes {
				var mine []string
				for _, p := range minority {
					if strings.HasPrefix(p, victim.host.ID().String()) {
						mine = append(mine, p)
					}
				}
				require.NotEmpty(t, mine, "%s proposed a head during the partition", victim.name)
			}
			if tc.healEarly {
				t.Logf("the proposal made during the partition reached quorum after the heal: %v",
					!slices.ContainsFunc(minority, func(p string) bool { return strings.HasPrefix(p, victim.host.ID().String()) }))
			}
		})
	}
}

// proposedAfter says whether a validator's log shows a head it proposed for a round after
// the given one.
func proposedAfter(logs string, round uint64) bool {
	for _, l := range strings.Split(logs, "\n") {
		if m := proposedRound.FindStringSubmatch(l); m != nil {
			if r, _ := strconv.ParseUint(m[1], 10, 64); r > round {
				return true
			}
		}
	}
	return false
}

var proposedRound = regexp.MustCompile(`msg="proposed head" .* round=(\d+) `)

// handedOn says whether n handed a round on: it could fetch no update of a pass
// (validator/stepaside.go, handOn).
func handedOn(n *clusterNode) bool { return hasEvent(n, "stepaside", "handing the round on") }

// tookOverHeard says whether n took a round over from a leader it still heard.
func tookOverHeard(n *clusterNode) bool { return hasEvent(n, "takeover", "was heard") }

// nodeLines keeps a node's own log lines (not those of the libraries under it).
func nodeLines(logs string) string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, " pkg=node ") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// requireConsistentChains checks that the nodes' chains agree on every round they share,
// and that the audit of the longest proves exactly-once; it returns the longest.
func (c *cluster) requireConsistentChains(nodes []*clusterNode) []*chain.Head {
	c.t.Helper()
	var longest []string
	var heads []*chain.Head
	var from *clusterNode
	for _, n := range nodes {
		ids, hs := c.chainOf(n)
		for i, h := range hs {
			require.Equal(c.t, uint64(i), h.Round, n.name)
		}
		if k := min(len(ids), len(longest)); k > 0 {
			require.Equal(c.t, longest[:k], ids[:k], "%s ended on another chain than %s", n.name, from.name)
		}
		if len(ids) > len(longest) {
			longest, heads, from = ids, hs, n
		}
	}
	stores, _ := OpenStores(from.cfg)
	rep, err := stores.Audit(mustDecode(c.t, longest[len(longest)-1]))
	require.NoError(c.t, err, "the audit must prove exactly-once")
	require.Zero(c.t, rep.Duplicated)
	return heads
}

// requireNoConflictingQuorums gathers every signature on every head any node stored (each
// node keeps the heads it proposed, attested or heard of, with the signatures it saw) and
// checks that no validator signed two heads of one round, and that no round has two heads
// with a quorum. It returns "signer round:head" for the heads that never reached quorum.
func (c *cluster) requireNoConflictingQuorums(quorum int) []string {
	c.t.Helper()
	type seen struct {
		round uint64
		sigs  map[string]bool
	}
	all := map[cid.Cid]*seen{}
	var validators []string
	for _, n := range c.nodes {
		if strings.HasPrefix(n.name, "validator") {
			validators = append(validators, n.host.ID().String())
		}
		stores, err := OpenStores(n.cfg)
		require.NoError(c.t, err)
		ids, err := stores.Heads.List()
		require.NoError(c.t, err)
		for _, id := range ids {
			sh, h, err := stores.Heads.Get(id)
			require.NoError(c.t, err)
			s := all[id]
			if s == nil {
				s = &seen{round: h.Round, sigs: map[string]bool{}}
				all[id] = s
			}
			for _, sig := range sh.Sigs {
				if slices.Contains(validators, sig.Peer) && chain.VerifySignature(id, sig) == nil {
					s.sigs[sig.Peer] = true
				}
			}
		}
	}
	signed := map[string]cid.Cid{} // "peer/round" → the head it signed
	quorate := map[uint64]cid.Cid{}
	var short []string
	for id, s := range all {
		for p := range s.sigs {
			key := fmt.Sprintf("%s/%d", p, s.round)
			if other, ok := signed[key]; ok {
				c.t.Fatalf("validator %s signed two heads of round %d: %s and %s", p, s.round, other, id)
			}
			signed[key] = id
		}
		if len(s.sigs) >= quorum {
			if other, ok := quorate[s.round]; ok {
				c.t.Fatalf("round %d has two heads with a quorum: %s and %s", s.round, other, id)
			}
			quorate[s.round] = id
			continue
		}
		for p := range s.sigs {
			short = append(short, fmt.Sprintf("%s %d:%s", p, s.round, cids.Short(id.String())))
		}
	}
	slices.Sort(short)
	return short
}
