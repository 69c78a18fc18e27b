package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/demo"
	"github.com/p2pnode/p2pnode/internal/wan"
)

// TestNATSwarm (issue 46 items 2 and 6, the short form): a public validator, which is
// also the bootstrap node and relay, and four trainers, a public one and one behind each
// kind of home router (cone, symmetric, closed), every link 40 ms from the core on
// 20/100 Mbit/s, digits for 3 rounds: every trainer's contribution is merged in every
// round, and each trainer behind a router is first merged no later than twice the public
// trainer's time from the swarm's start plus 10 s (item 2's goal). It needs root, ip, tc,
// nft and /dev/net/tun (internal/wan), and says which is missing when it skips.
func TestNATSwarm(t *testing.T) {
	if err := wan.CheckNAT(); err != nil {
		t.Skipf("the NAT lab cannot run here: %v", err)
	}
	rounds := envInt("WAN_ROUNDS", 3)
	link := wan.Link{UpMbit: 20, DownMbit: 100, RTT: 40 * time.Millisecond}
	kinds := []wan.NAT{wan.NATNone, wan.NATCone, wan.NATSymmetric, wan.NATClosed}
	spec := wan.LabSpec{Nodes: []wan.Spec{{Name: "validator", Link: wan.Link{RTT: 20 * time.Millisecond}}}, Seed: 46}
	for i, k := range kinds {
		spec.Nodes = append(spec.Nodes, wan.Spec{Name: fmt.Sprintf("trainer-%d", i+1), Link: link, NAT: k})
	}
	lab := newLab(t, spec)
	procs := labSwarm(t, lab, demo.Options{Dir: labDir(t), Trainers: len(kinds), Rounds: rounds}, nil)
	keepLogs(t, procs)
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	start := time.Now()
	runAll(t, procs, 6*time.Minute)
	// What each trainer found out about its reachability (p2p.WatchReachability); with
	// WAN_AUTONAT=1 it finds out for itself.
	for _, p := range procs[1:] {
		for _, l := range strings.Split(p.Logs(), "\n") {
			if strings.Contains(l, "reachability:") || strings.Contains(l, "NAT in front") || strings.Contains(l, "relay reservations") {
				t.Logf("%s: %s", p.Name, l)
			}
		}
	}
	label := func(k wan.NAT) string {
		if k == wan.NATNone {
			return "public"
		}
		return string(k)
	}
	kindOf := map[string]wan.NAT{}
	for i, p := range procs[1:] {
		kindOf[p.peerID(t)] = kinds[i]
	}
	// When the validator printed each round: a trainer's first merge is its round's time.
	v := procs[0]
	closedAt := map[int]time.Duration{}
	for i, at := range v.RoundTimes() {
		if rs := v.Rounds(); i < len(rs) {
			closedAt[rs[i]] = at.Sub(start)
		}
	}
	heads := v.HeadChain(t)
	var missing []string
	firstMerged := map[wan.NAT]time.Duration{}
	for _, h := range heads[1:] {
		var in []string
		for _, c := range h.Contributions {
			if k, ok := kindOf[c.Peer]; ok {
				in = append(in, label(k))
				if _, seen := firstMerged[k]; !seen {
					firstMerged[k] = closedAt[int(h.Round)]
				}
			}
		}
		for _, k := range kinds {
			if !slices.Contains(in, label(k)) {
				missing = append(missing, fmt.Sprintf("round %d: %s", h.Round, label(k)))
			}
		}
		t.Logf("round %d merged %v", h.Round, in)
	}
	if len(heads) != rounds+1 {
		t.Fatalf("the validator's chain has %d heads, want genesis and %d rounds", len(heads), rounds)
	}
	if len(missing) > 0 {
		t.Fatalf("trainers not merged: %s", strings.Join(missing, "; "))
	}
	public := firstMerged[wan.NATNone]
	for _, k := range kinds[1:] {
		t.Logf("first merged %s from the start: %v (public: %v)", k, firstMerged[k].Round(time.Millisecond), public.Round(time.Millisecond))
		if limit := 2*public + 10*time.Second; firstMerged[k] > limit {
			t.Errorf("the trainer behind %s was first merged %v after the start, over twice the public trainer's %v plus 10 s",
				k, firstMerged[k].Round(time.Millisecond), public.Round(time.Millisecond))
		}
	}
}
