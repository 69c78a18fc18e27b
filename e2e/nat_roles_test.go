//go:build wan

package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/demo"
	"github.com/p2pnode/p2pnode/internal/wan"
)

var caughtUpLine = regexp.MustCompile(`msg="caught up" .*?peer=(\S+)`)

// TestNATLateJoiner (issue 46 item 2): TestNATSwarm's lab with a fourth trainer behind a
// cone router that starts once the validator has closed round 2. It asserts that the
// joiner ends on the validator's tip and is merged in a later round. The public validator
// is the only peer it can reach in the lab, so that is where it catches up from.
func TestNATLateJoiner(t *testing.T) {
	if err := wan.CheckNAT(); err != nil {
		t.Skipf("the NAT lab cannot run here: %v", err)
	}
	rounds := envInt("WAN_ROUNDS", 12)
	link := wan.Link{UpMbit: 20, DownMbit: 100, RTT: 40 * time.Millisecond}
	kinds := []wan.NAT{wan.NATCone, wan.NATSymmetric, wan.NATClosed, wan.NATCone}
	spec := wan.LabSpec{Nodes: []wan.Spec{{Name: "validator", Link: wan.Link{RTT: 20 * time.Millisecond}}}, Seed: 46}
	for i, k := range kinds {
		spec.Nodes = append(spec.Nodes, wan.Spec{Name: fmt.Sprintf("trainer-%d", i+1), Link: link, NAT: k})
	}
	lab := newLab(t, spec)
	procs := labSwarm(t, lab, demo.Options{Dir: labDir(t), Trainers: len(kinds), Rounds: rounds}, nil)
	keepLogs(t, procs)
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	v, late := procs[0], procs[len(procs)-1]
	for _, p := range procs[:len(procs)-1] {
		p.Start()
	}
	waitRound(t, v, 2, 4*time.Minute)
	joined := lastRound(v)
	late.Start()
	waitAll(t, procs, 6*time.Minute)
	id := late.peerID(t)
	var merged []int
	heads := v.HeadChain(t)
	for _, h := range heads[1:] {
		for _, c := range h.Contributions {
			if c.Peer == id {
				merged = append(merged, int(h.Round))
			}
		}
	}
	var from []string
	for _, m := range caughtUpLine.FindAllStringSubmatch(late.Logs(), -1) {
		who := m[1]
		if who == v.peerID(t) {
			who = "the validator"
		}
		if !slices.Contains(from, who) {
			from = append(from, who)
		}
	}
	t.Logf("the joiner behind cone started after round %d of %d; caught up from %v; merged in rounds %v", joined, rounds, from, merged)
	if len(heads) != rounds+1 {
		t.Fatalf("the validator's chain has %d heads, want genesis and %d rounds", len(heads), rounds)
	}
	if a, b := readTip(t, v), readTip(t, late); a != b {
		t.Fatalf("the joiner ended on head %s, the validator on %s", b, a)
	}
	if len(merged) == 0 {
		t.Fatalf("the joiner behind NAT was never merged (it started after round %d)", joined)
	}
}
