//go:build wan

package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/demo"
	"github.com/p2pnode/p2pnode/internal/wan"
	"github.com/p2pnode/p2pnode/p2p"
)

var (
	caughtUpLine = regexp.MustCompile(`msg="caught up" .*?peer=(\S+)`)
	// fetchedLine is a download's debug line: how many chunks each holder sent.
	fetchedLine = regexp.MustCompile(`msg=fetched .*? chunks=(\d+) chunks_from=("[^"]*"|\S*)`)
)

// TestNATLateJoiner (issue 46 item 2): TestNATSwarm's lab with a fourth trainer behind a
// cone router that starts once the validator has closed round 2. It asserts that the
// joiner ends on the validator's tip, is merged in a later round, and caught up from a
// trainer behind NAT as well as from the public validator: it downloads the anchor head
// (upkeep.AnchorEvery; genesis here) and rebuilds the heads after it from their updates;
// the trainers announce the head's and the anchor's artifacts they keep (copies, asked
// over direct connections only), and the joiner's relayed connection to the trainer
// behind the other cone router turns direct by hole punching (the lab's outside addresses
// public to the nodes: p2p.LabAddressesEnv), while the trainers behind symmetric and
// closed routers, reachable only through the relay, are not asked for the model. The
// chunks of the catch-up — the model or the updates — must include some from the cone
// trainer over a direct connection: the model's download starts as the joiner does,
// before any hole punch can have been made (7-8 s at the validator's 20 Mbit/s, and the
// punch came 5-12 s after the start in the lab's runs), so which of the two it serves
// depends on when the punch comes. The model is large enough that its download takes
// seconds (WAN_HIDDEN, default 2048: 4.3 M parameters, 17 MB, 17 chunks); sparse, so that
// a round's traffic is updates, not the model. A window is WAN_INNER_STEPS (60) steps.
func TestNATLateJoiner(t *testing.T) {
	if err := wan.CheckNAT(); err != nil {
		t.Skipf("the NAT lab cannot run here: %v", err)
	}
	rounds := envInt("WAN_ROUNDS", 8)
	link := wan.Link{UpMbit: 20, DownMbit: 100, RTT: 40 * time.Millisecond}
	kinds := []wan.NAT{wan.NATCone, wan.NATSymmetric, wan.NATClosed, wan.NATCone}
	spec := wan.LabSpec{Nodes: []wan.Spec{{Name: "validator", Link: wan.Link{UpMbit: 20, DownMbit: 100, RTT: 20 * time.Millisecond}}}, Seed: 46}
	for i, k := range kinds {
		spec.Nodes = append(spec.Nodes, wan.Spec{Name: fmt.Sprintf("trainer-%d", i+1), Link: link, NAT: k})
	}
	lab := newLab(t, spec)
	joiner := fmt.Sprintf("trainer-%d", len(kinds))
	procs := labSwarm(t, lab, demo.Options{Dir: labDir(t), Trainers: len(kinds), Rounds: rounds, Codec: "sparse"}, func(name string, c *config.Config) {
		c.Workload.Config["hidden"] = envInt("WAN_HIDDEN", 2048)
		c.Protocol.InnerSteps = envInt("WAN_INNER_STEPS", 60)
		if name == joiner {
			c.Node.LogLevel = "debug" // its downloads' chunks per holder, counted below
		}
	})
	for _, p := range procs {
		p.Wrap = append(p.Wrap, "env", p2p.LabAddressesEnv+"=1")
	}
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
	// Where its downloads' chunks came from, by the holder's router.
	kindOf := map[string]string{v.peerID(t): "the validator"}
	for i, p := range procs[1 : len(procs)-1] {
		kindOf[p.peerID(t)] = fmt.Sprintf("%s (%s)", p.Name, kinds[i])
	}
	// The model's artifacts (parameters, outer state: many chunks) and the updates a
	// rebuild fetches (one chunk each, asked of their trainer too, through the relay where
	// only that connects them: the trainer is their origin).
	model, updates := map[string]int{}, map[string]int{}
	for _, m := range fetchedLine.FindAllStringSubmatch(late.Logs(), -1) {
		into := updates
		if m[1] != "1" {
			into = model
		}
		for _, part := range strings.Split(strings.Trim(m[2], `"`), ",") {
			who, n, ok := strings.Cut(part, ":")
			if !ok {
				continue
			}
			how := ""
			if k, relayed := strings.CutSuffix(n, " relayed"); relayed {
				n, how = k, ", relayed"
			}
			c, err := strconv.Atoi(n)
			if err != nil {
				t.Fatalf("chunks_from %q: %v", m[2], err)
			}
			name, ok := kindOf[who]
			if !ok {
				name = who
			}
			into[name+how] += c
		}
	}
	t.Logf("the joiner's downloads of the model took their chunks from %v; of updates from %v", model, updates)
	if len(heads) != rounds+1 {
		t.Fatalf("the validator's chain has %d heads, want genesis and %d rounds", len(heads), rounds)
	}
	if a, b := readTip(t, v), readTip(t, late); a != b {
		t.Fatalf("the joiner ended on head %s, the validator on %s", b, a)
	}
	if len(merged) == 0 {
		t.Fatalf("the joiner behind NAT was never merged (it started after round %d)", joined)
	}
	if !strings.Contains(late.Logs(), `msg="downloaded the anchor head`) {
		t.Errorf("the joiner did not catch up from the anchor head")
	}
	cone := kindOf[procs[1].peerID(t)]
	if model[cone]+updates[cone] == 0 {
		t.Errorf("the joiner took no chunk of the model or of the updates from %s over a direct connection (model: %v; updates: %v)", cone, model, updates)
	}
	for who, n := range model {
		if strings.HasSuffix(who, ", relayed") && n > 0 {
			t.Errorf("%d chunks of the model from %s came through the relay: a copy is asked over direct connections only", n, who)
		}
	}
}
