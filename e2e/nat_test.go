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

// TestNATSwarm (issue 46 item 6, the short form): a public validator, which is also the
// bootstrap node, and three trainers, one behind each kind of home router (cone,
// symmetric, closed), every link 40 ms from the core on 20/100 Mbit/s, digits for 3 rounds:
// every trainer's contribution is merged in every round. It needs root, ip, tc, nft and
// /dev/net/tun (internal/wan), and says which is missing when it skips.
func TestNATSwarm(t *testing.T) {
	if err := wan.CheckNAT(); err != nil {
		t.Skipf("the NAT lab cannot run here: %v", err)
	}
	const rounds = 3
	link := wan.Link{UpMbit: 20, DownMbit: 100, RTT: 40 * time.Millisecond}
	kinds := []wan.NAT{wan.NATCone, wan.NATSymmetric, wan.NATClosed}
	spec := wan.LabSpec{Nodes: []wan.Spec{{Name: "validator", Link: wan.Link{RTT: 20 * time.Millisecond}}}, Seed: 46}
	for i, k := range kinds {
		spec.Nodes = append(spec.Nodes, wan.Spec{Name: fmt.Sprintf("trainer-%d", i+1), Link: link, NAT: k})
	}
	lab := newLab(t, spec)
	procs := labSwarm(t, lab, demo.Options{Dir: t.TempDir(), Trainers: len(kinds), Rounds: rounds}, nil)
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	runAll(t, procs, 6*time.Minute)
	kindOf := map[string]wan.NAT{}
	for i, p := range procs[1:] {
		kindOf[p.peerID(t)] = kinds[i]
	}
	heads := procs[0].HeadChain(t)
	var missing []string
	for _, h := range heads[1:] {
		var in []string
		for _, c := range h.Contributions {
			if k, ok := kindOf[c.Peer]; ok {
				in = append(in, string(k))
			}
		}
		for _, k := range kinds {
			if !slices.Contains(in, string(k)) {
				missing = append(missing, fmt.Sprintf("round %d: %s", h.Round, k))
			}
		}
		t.Logf("round %d merged %v", h.Round, in)
	}
	if len(heads) != rounds+1 {
		t.Fatalf("the validator's chain has %d heads, want genesis and %d rounds", len(heads), rounds)
	}
	if len(missing) > 0 {
		t.Fatalf("trainers behind NAT not merged: %s", strings.Join(missing, "; "))
	}
}
