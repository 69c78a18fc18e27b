package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/config"
)

// damage is what a chaos step does to a killed node's store before it starts again.
type damage struct {
	name string
	// trainerOnly: a validator's tip may be a head no peer has yet, and a validator that
	// cannot read its tip refuses to start (it must not sign a second head for a round).
	trainerOnly bool
	do          func(t *testing.T, store string)
}

var chaosDamages = []damage{
	{"none", false, func(*testing.T, string) {}},
	{"state deleted", false, func(t *testing.T, store string) {
		if err := os.RemoveAll(filepath.Join(store, "state")); err != nil {
			t.Fatal(err)
		}
	}},
	{"state files corrupted", false, func(t *testing.T, store string) {
		files, _ := filepath.Glob(filepath.Join(store, "state", "state-*"))
		for _, f := range files {
			if err := os.WriteFile(f, []byte("garbage"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}},
	{"tip head corrupted", true, func(t *testing.T, store string) {
		b, err := os.ReadFile(filepath.Join(store, "tip"))
		if err != nil {
			return // killed before its first head
		}
		path := filepath.Join(store, "heads", strings.TrimSpace(string(b)))
		h, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		h[len(h)/2] ^= 0xff
		if err := os.WriteFile(path, h, 0o644); err != nil {
			t.Fatal(err)
		}
	}},
}

// TestChaosKillsAndDamagedState runs a validator and two trainers (real processes, the
// Python digits workload) and kill -9s one of them at random moments chaosKills times,
// damaging the killed node's local state in one of the ways above before it starts again.
// After each restart: the node resumes at the round it last printed or later, no scratch
// directory of the killed process is left in /dev/shm, and the validator closes the next
// round within 2 × the normal round time + 10 s of the node being back. At the end: every
// node on the same head and the audit passes (nothing lost or merged twice).
//
// The default is a short run for `make test`; `go test -tags chaos` runs the long one.
func TestChaosKillsAndDamagedState(t *testing.T) {
	rounds := 10 + 3*chaosKills
	dir := t.TempDir()
	procs := swarm(t, dir, 2, rounds, func(_ string, c *config.Config) {
		c.Protocol.InnerSteps = 100
		c.Lease.RoundTimeout = 20 * time.Second
	})
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	startSwarm(t, procs)
	v := procs[0]
	waitRound(t, v, 3, 3*time.Minute)
	normal := roundTime(v)
	t.Logf("normal round time %v", normal.Round(time.Millisecond))

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 13))
	t.Logf("chaos seed %d", seed)
	var slowest time.Duration
	for kill := range chaosKills {
		i := rng.IntN(len(procs))
		victim := procs[i]
		dmg := chaosDamages[rng.IntN(len(chaosDamages))]
		for dmg.trainerOnly && i == 0 {
			dmg = chaosDamages[rng.IntN(len(chaosDamages))]
		}
		time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
		if lastRound(v) >= rounds-3 {
			break
		}
		pid := victim.PID()
		victim.Kill()
		printed := lastRound(victim)
		dmg.do(t, victim.Cfg.Node.StoreDir)

		p := NewProc(t, dir, victim.Name, victim.Cfg)
		DumpOnFailure(t, p)
		p.Start()
		procs[i] = p
		v = procs[0]
		Eventually(t, 2*time.Minute, p.Name+" to print a round", func() bool { return len(p.Rounds()) > 0 })
		back := time.Now()
		if first := p.Rounds()[0]; first < printed {
			t.Fatalf("kill %d (%s, %s): restarted at round %d, but round %d was printed before the kill", kill+1, victim.Name, dmg.name, first, printed)
		}
		closed := lastRound(v)
		if closed >= rounds {
			// The run finished between the check above and the kill (rounds take ~0.2 s), or
			// while the node was restarting (its Python worker took 22 s to start on a loaded
			// machine, longer than the rounds left): there is no next round to time.
			t.Logf("kill %d: %s (pid %d) after round %d, %s; the run had closed its last round by the time it was back", kill+1, victim.Name, pid, printed, dmg.name)
			if i != 0 {
				// A trainer back after the run's end catches up from the validator while it
				// is still there; once it has exited, nobody is left to sync from. Such a
				// trainer is stopped, and its tip must be a head of the validator's chain.
				if err := v.Wait(5 * time.Minute); err != nil {
					t.Fatal(err)
				}
				if lastRound(p) < rounds {
					if err := p.Stop(30 * time.Second); err != nil {
						t.Fatalf("%s: %v", p.Name, err)
					}
					tip := readTip(t, p)
					if _, err := os.Stat(filepath.Join(v.Cfg.Node.StoreDir, "heads", tip)); err != nil {
						t.Fatalf("%s stopped at a tip the validator does not hold: %v", p.Name, err)
					}
					t.Logf("%s was back at round %d after the validator had exited; stopped at %s", p.Name, lastRound(p), tip)
					procs = append(procs[:i], procs[i+1:]...)
				}
			}
			break
		}
		waitRound(t, v, closed+1, 2*time.Minute)
		took := time.Since(back)
		slowest = max(slowest, took)
		t.Logf("kill %d: %s (pid %d) after round %d, %s; resumed at round %d; next round closed %v after it was back",
			kill+1, victim.Name, pid, printed, dmg.name, p.Rounds()[0], took.Round(time.Millisecond))
		if limit := 2*normal + 10*time.Second; took > limit {
			t.Errorf("kill %d (%s, %s): the next round closed %v after the node was back, over 2 × %v + 10 s", kill+1, victim.Name, dmg.name, took, normal)
		}
		if leaked, _ := filepath.Glob(fmt.Sprintf("/dev/shm/p2pnode-%d-*", pid)); len(leaked) > 0 {
			t.Errorf("kill %d: scratch of the killed process left behind: %v", kill+1, leaked)
		}
	}
	waitAll(t, procs, 5*time.Minute)
	sameTips(t, procs)
	if out, err := exec.Command(mustBinary(t), "audit", "--config", procs[0].Config).CombinedOutput(); err != nil {
		t.Fatalf("audit: %v\n%s", err, out)
	}
	t.Logf("%d rounds; slowest recovery %v (normal round %v)", rounds, slowest.Round(time.Millisecond), normal.Round(time.Millisecond))
}

// roundTime is the median time between the rounds a process printed so far.
func roundTime(p *Proc) time.Duration {
	ts := p.RoundTimes()
	var gaps []time.Duration
	for i := 1; i < len(ts); i++ {
		gaps = append(gaps, ts[i].Sub(ts[i-1]))
	}
	if len(gaps) == 0 {
		return 0
	}
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	return gaps[len(gaps)/2]
}

// TestChaosValidatorThenItsLeasedTrainer is issue 13's sequence with real processes: the
// validator is killed (kill -9) and restarted, and the trainer that gets its first lease
// is killed as soon as it holds it and started again 2 s later. With min_group 2 the round
// needs that trainer, and lease.round_timeout is 2 min: the old validator gave that lease
// the ceiling as its deadline (no pace known after the restart) and barred the trainer
// from its round once back, so the next round came 122 s later. Now the lost lease is
// settled when the trainer falls silent or announces its new start, the trainer is leased
// again if it is back within the round, and the round closes within 2 × the normal round
// time + 10 s of the trainer being back (printing a round).
func TestChaosValidatorThenItsLeasedTrainer(t *testing.T) {
	const rounds = 10
	dir := t.TempDir()
	procs := swarm(t, dir, 2, rounds, func(_ string, c *config.Config) {
		c.Protocol.InnerSteps = 100
		c.Lease.MinGroup = 2
		c.Lease.RoundTimeout = 2 * time.Minute
	})
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	startSwarm(t, procs)
	waitRound(t, procs[0], 4, 3*time.Minute)
	normal := roundTime(procs[0])

	procs[0].Kill()
	v := NewProc(t, dir, procs[0].Name, procs[0].Cfg)
	DumpOnFailure(t, v)
	v.Start()
	procs[0] = v
	var leased map[string]int
	var round uint64
	Eventually(t, 2*time.Minute, "the restarted validator's first lease", func() bool {
		st := statusOf(v)
		if st == nil || st.Validator == nil || len(st.Validator.Leased) == 0 {
			return false
		}
		leased, round = st.Validator.Leased, st.Validator.Round
		return true
	})
	victim := -1
	for i, p := range procs[1:] {
		if _, ok := leased[p.peerID(t)]; ok && victim < 0 {
			victim = i + 1
		}
	}
	if victim < 0 {
		t.Fatalf("round %d leases %v name no trainer", round, leased)
	}
	old := procs[victim]
	id := old.peerID(t)
	old.Kill()
	time.Sleep(2 * time.Second)
	p := NewProc(t, dir, old.Name, old.Cfg)
	DumpOnFailure(t, p)
	p.Start()
	procs[victim] = p
	Eventually(t, 2*time.Minute, p.Name+" to print a round", func() bool { return len(p.Rounds()) > 0 })
	back := time.Now()
	waitRound(t, v, int(round), 3*time.Minute)
	took := time.Since(back)
	t.Logf("round %d closed %v after %s was back (normal round %v, limit %v)", round, took.Round(time.Millisecond), p.Name,
		normal.Round(time.Millisecond), (2*normal + 10*time.Second).Round(time.Millisecond))
	if limit := 2*normal + 10*time.Second; took > limit {
		t.Errorf("round %d closed %v after the trainer was back, over 2 × %v + 10 s", round, took, normal)
	}
	waitAll(t, procs, 5*time.Minute)
	sameTips(t, procs)
	heads := v.HeadChain(t)
	var merged []string
	for _, c := range heads[round].Contributions {
		merged = append(merged, c.Peer)
	}
	// Whether the trainer is back within its round depends on how fast its worker starts
	// (3-10 s here under -race) next to the round's patience: the re-admission itself is
	// asserted in node.TestRestartedTrainerIsLeasedAgainInItsRound.
	t.Logf("round %d merged the trainer that came back: %v (merged %v)", round, slices.Contains(merged, id), merged)
	if out, err := exec.Command(mustBinary(t), "audit", "--config", v.Config).CombinedOutput(); err != nil {
		t.Fatalf("audit: %v\n%s", err, out)
	}
}
