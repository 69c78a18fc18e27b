package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/adversary"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/node"
)

// TestSwarmOneThirdAttackersDigits is the process-level row set of the one-third-attackers
// matrix (docs/security.md): real p2pnode processes with the Python digits workload, six
// honest trainers and three attackers (`p2pnode run --poison MODE`, which the harness's
// attack build has) per row, against a run
// of the six honest trainers alone. Ten processes per run make it too slow for `make test`
// on a small machine, so it runs only when asked:
//
//	P2PNODE_E2E_ATTACKS=nan,scale,flip,noise,replay,nolease go test -count=1 -run 'TestSwarmOneThirdAttackersDigits$' -v ./e2e/
//
// (P2PNODE_E2E_ATTACKS=1 runs a representative subset). P2PNODE_E2E_SHAPE=half runs the
// half form instead: four honest trainers and four attackers, started by turns (issue 42).
// The table goes to the log and to e2e/logs/attacks-digits.md (attacks-digits-half.md).
func TestSwarmOneThirdAttackersDigits(t *testing.T) {
	env := os.Getenv("P2PNODE_E2E_ATTACKS")
	if env == "" {
		t.Skip("slow (ten processes per run): set P2PNODE_E2E_ATTACKS=1 or a list of --poison modes")
	}
	kinds := []string{string(adversary.Scale), string(adversary.Flip), string(adversary.Noise), string(adversary.NoLease)}
	if env != "1" {
		kinds = strings.Split(env, ",")
	}
	shape, log := digitsShape{honest: 6, attackers: 3}, "attacks-digits.md"
	switch s := os.Getenv("P2PNODE_E2E_SHAPE"); s {
	case "", "third":
	case "half":
		shape, log = digitsShape{honest: 4, attackers: 4, mixed: true}, "attacks-digits-half.md"
	default:
		t.Fatalf("P2PNODE_E2E_SHAPE=%q: want third or half", s)
	}
	const rounds = 12
	clean := runDigitsAttack(t, "", rounds, shape)
	t.Logf("clean: held-out loss %.4f, accuracy %.3f, %.2f s/round", clean.loss, clean.acc, clean.perRound)
	var b strings.Builder
	fmt.Fprintf(&b, "%d trainers (%d attacking), 1 validator, %d rounds, digits workload, real processes on loopback; clean run: %d honest trainers alone, held-out loss %.4f, accuracy %.1f %%, %.2f s/round\n\n",
		shape.honest+shape.attackers, shape.attackers, rounds, shape.honest, clean.loss, 100*clean.acc, clean.perRound)
	b.WriteString("| --poison | attacker updates merged | rounds stalled | held-out loss vs clean | accuracy | s/round (clean) | rejections | attackers quarantined |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, k := range kinds {
		t.Run(k, func(t *testing.T) {
			r := runDigitsAttack(t, k, rounds, shape)
			fmt.Fprintf(&b, "| %s | %d | %d | %+.2f %% | %.1f %% | %.2f (%.2f) | %v | %d of %d |\n",
				k, r.merged, r.stalled, 100*(r.loss-clean.loss)/clean.loss, 100*r.acc, r.perRound, clean.perRound, r.rejections, r.quarantined, shape.attackers)
			t.Logf("%s: merged %d, stalled %d, loss %.4f (clean %.4f), %.2f s/round, rejections %v, quarantined %d",
				k, r.merged, r.stalled, r.loss, clean.loss, r.perRound, r.rejections, r.quarantined)
			if r.merged != 0 {
				t.Errorf("%d attacker updates merged", r.merged)
			}
			if r.stalled != 0 {
				t.Errorf("%d rounds stalled", r.stalled)
			}
		})
	}
	t.Log("\n" + b.String())
	dir := filepath.Join(RepoRoot(), "e2e", "logs")
	if err := os.MkdirAll(dir, 0o755); err == nil {
		_ = os.WriteFile(filepath.Join(dir, log), []byte(b.String()), 0o644)
	}
}

type digitsAttack struct {
	loss, acc   float64
	perRound    float64
	merged      int
	stalled     int
	rejections  map[string]uint64
	quarantined int
}

// digitsShape is a process run's trainers: honest ones, attackers, and whether the two
// start by turns (mixed) or the attackers last.
type digitsShape struct {
	honest, attackers int
	mixed             bool
}

// runDigitsAttack runs the validator, the shape's honest trainers and, with a mode, its
// attackers poisoned with it.
func runDigitsAttack(t *testing.T, mode string, rounds int, shape digitsShape) digitsAttack {
	t.Helper()
	const timeout = 20 * time.Second
	honest := shape.honest
	trainers := honest
	if mode != "" {
		trainers += shape.attackers
	}
	dir := t.TempDir()
	procs := swarm(t, dir, trainers, rounds, func(_ string, c *config.Config) {
		c.Lease.MinGroup = honest
		c.Lease.RoundTimeout = timeout
		c.Lease.MicroshardsPerTrainer = 1
	})
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	for _, p := range procs[1+honest:] {
		p.Args = []string{"--poison", mode}
	}
	if shape.mixed {
		// Honest and attacker by turns: the validator, h1, a1, h2, a2, ...
		order := []*Proc{procs[0]}
		for i := range max(honest, trainers-honest) {
			if i < honest {
				order = append(order, procs[1+i])
			}
			if 1+honest+i < len(procs) {
				order = append(order, procs[1+honest+i])
			}
		}
		startSwarm(t, order)
	} else {
		startSwarm(t, procs)
	}
	waitAll(t, procs, 10*time.Minute)
	v := procs[0]
	var out digitsAttack
	var ok bool
	if out.loss, ok = v.MetricAt(rounds, "loss"); !ok {
		t.Fatalf("the validator printed no held-out loss for round %d:\n%s", rounds, v.Output())
	}
	out.acc, _ = v.AccuracyAt(rounds)
	// From round 1 on (genesis is printed before the trainers' workers have started).
	at := v.RoundTimes()
	if len(at) >= 3 {
		out.perRound = at[len(at)-1].Sub(at[1]).Seconds() / float64(len(at)-2)
		for i := 2; i < len(at); i++ {
			if at[i].Sub(at[i-1]) > 2*timeout {
				out.stalled++
			}
		}
	}
	tip := sameTips(t, procs[:1+honest])
	st, err := node.OpenStores(v.Cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, heads, err := st.Heads.Chain(cid.MustParse(tip))
	if err != nil {
		t.Fatal(err)
	}
	if got := len(heads) - 1; got != rounds {
		out.stalled += rounds - got
	}
	bad := map[string]bool{}
	for _, p := range procs[1+honest:] {
		bad[p.peerID(t)] = true
	}
	for _, h := range heads {
		for _, c := range h.Contributions {
			if bad[c.Peer] {
				out.merged++
			}
		}
	}
	quarantined := map[string]bool{}
	out.rejections = map[string]uint64{}
	for _, line := range strings.Split(v.Logs(), "\n") {
		for id := range bad {
			if strings.Contains(line, "peer quarantined") && strings.Contains(line, "peer="+id) {
				quarantined[id] = true
			}
		}
		if !strings.Contains(line, "contribution rejected") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if r, ok := strings.CutPrefix(f, "reason="); ok {
				out.rejections[r]++
			}
		}
	}
	out.quarantined = len(quarantined)
	return out
}
