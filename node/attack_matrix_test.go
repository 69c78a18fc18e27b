//go:build attack

package node

import (
	"context"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/adversary"
	"github.com/p2pnode/p2pnode/synth"
)

// The one-third-attackers matrix (issue 12 item 4, docs/security.md): nine trainers, three
// of them attacking, one row per kind of attack, each against a clean run of the six honest
// trainers alone on the same seed and peer ids.
//
//	go test -race -count=1 -run 'TestOneThirdAttackers$' -v ./node/
//
// It runs only with P2PNODE_ATTACK_MATRIX set. P2PNODE_ATTACK_MATRIX=short runs the short
// form: 4 rounds per run and up to three rows at a time (matrixParallel, each cluster with
// its own peer ids, and each row with its own clean run on those ids), so that the rows
// that wait out deadlines (never-report, late) overlap with the others. Its assertions do
// not depend on the figures of one schedule: no attacker update merged, no delta credited
// twice, no round stalled (longer than two round timeouts), no honest trainer quarantined,
// and the held-out loss within 2 % of the clean run's where both trained on the same data.
//
// The loss check asks whether the attackers changed the model the honest trainers built,
// so it holds the data fixed. The attackers' peer ids sort after the honest ones' and
// leases go out in peer order, so while the honest trainers are heard in the same attempts
// they get the same microshards in both runs, and train them with the same seeds (a
// function of round, attempt and peer id). With every attacker update screened out, the
// attacked run's merges are then the clean run's, bit for bit (a head depends only on what
// was merged, and the next round's data order only on the merged parameters), and its loss
// is the clean run's; an attacker update merged in a round changes that round's
// parameters, and its loss. Once the honest work merged differs — an honest trainer not
// heard when a round's leases went out (load), or an honest update rejected — the two runs
// train on other data from then on, and the synthetic workload's loss depends on which
// microshards were merged (−17 % to +11 % after four rounds of otherwise equal runs, when
// the rows had other peer ids than the clean run). So the loss is compared at the last
// round up to which both runs merged the same honest work (the same trainers with the same
// microshards each round; the table's "at round" column), and honest work lost shows in
// the honest updates merged against the clean run's. A row whose first round already
// differs has no round to compare and says so. A clean run of all nine trainers honest is
// no reference: it merges half as much work again, and from round 2 trains other data.
//
// P2PNODE_ATTACK_MATRIX=1 runs the full form (8 rounds per run, one row at a time on the
// clean run's peer ids, so the s/round column compares with the one clean run);
// P2PNODE_ATTACK_MATRIX=copy,stale-base runs those rows only (the clean run always).
// P2PNODE_ATTACK_ROUNDS sets the rounds per run, P2PNODE_ATTACK_PARALLEL the rows run at a
// time (above 1, each row gets its own peer ids and clean run); P2PNODE_ATTACK_TABLE names
// a file the table is written to (Markdown) as well as the test log; with
// P2PNODE_ATTACK_LOGS set every run logs its validator's log, not only a failed one.
//
// `make test` runs the short form in a step of its own, after every package's tests: on
// the shared 2-core machine at a load average of 45–56 the clean run alone took 26 s a
// round, and rows side by side had every honest contribution rejected `late` and all four
// rounds stalled (docs/security.md). The copy row's goal is the issue's, a copy credited
// once at most: a copy that reaches the validator before its original is credited to the
// copier (1 of 6 short runs at a load average of 3–6), which merges the same update.

const (
	matrixTimeout  = 20 * time.Second // lease.round_timeout of every matrix run
	matrixParallel = 3                // rows run at a time in the short form
)

// matrixShape is a matrix's swarm: how many trainers are honest and how many attack, and
// how the attackers sit among the honest ones.
type matrixShape struct {
	honest, attackers int
	// mixed: the attackers' peer ids, and so their place in lease order, fall among the
	// honest ones' and they start interleaved with them. Otherwise their ids sort last and
	// everyone starts together (the one-third matrix: its loss comparison needs the honest
	// trainers' leases to be the clean run's).
	mixed bool
}

var (
	thirdShape    = matrixShape{honest: 6, attackers: 3}
	halfShape     = matrixShape{honest: 4, attackers: 4, mixed: true}
	halfFullShape = matrixShape{honest: 8, attackers: 8, mixed: true}
)

// attacker says whether trainer j (0-based, in index order) of a run of this shape attacks.
func (s matrixShape) attacker(j int) bool {
	if !s.mixed {
		return j >= s.honest
	}
	every := (s.honest + s.attackers) / s.attackers
	return j%every == every-1 && j/every < s.attackers
}

type attackKind struct {
	name   string         // the row's label
	poison adversary.Mode // the attackers' mode (attackOption, attack.go)
	bus    string         // or the attackers' bus attack (attackbus_test.go)
	// subtle: built to pass screening one update at a time (adversary.Subtle); its row
	// measures the damage, and asserts no more than that the swarm keeps going.
	subtle bool
	// first: the attackers (and the validator) start first, the honest trainers once the
	// chain has reached round 2 without them.
	first bool
}

var attackKinds = []attackKind{
	{name: "nan", poison: adversary.NaN},
	{name: "x1000", poison: adversary.Scale},
	{name: "sign-flip", poison: adversary.Flip},
	{name: "noise", poison: adversary.Noise},
	{name: "replay", poison: adversary.Replay},
	{name: "copy", bus: busCopy},
	{name: "stale-base", bus: busStale},
	{name: "unleased", poison: adversary.NoLease},
	{name: "never-report", bus: busSilent},
	{name: "late", bus: busLate},
	{name: "collude", poison: adversary.Collude, subtle: true},
	{name: "alie", poison: adversary.ALIE, subtle: true},
	{name: "drift", poison: adversary.Drift, subtle: true},
}

// halfKinds are the half matrix's rows: every kind, and sign flip with the attackers first.
var halfKinds = append(slices.Clone(attackKinds), attackKind{name: "sign-flip-first", poison: adversary.Flip, first: true})

var attackLabels = map[string]string{
	"nan":             "NaN/Inf in the update",
	"x1000":           "update ×1000",
	"sign-flip":       "sign flip",
	"noise":           "Gaussian noise at the honest norm",
	"replay":          "replay of an already merged delta",
	"copy":            "copy of another trainer's current delta",
	"stale-base":      "contribution on a stale base head",
	"unleased":        "contribution under a lease nobody granted",
	"never-report":    "leases taken, never reported",
	"late":            "always reports after the deadline",
	"collude":         "colluders sending one direction, each at its honest norm",
	"alie":            "a little is enough: 1 σ of the honest spread",
	"drift":           "slow drift: a constant bias of 0.1 × the honest norm",
	"sign-flip-first": "sign flip, attackers started first",
}

// matrixRun is what one run measured.
type matrixRun struct {
	kind      string
	rounds    int       // rounds the chain reached
	mse       float64   // held-out loss of the last head
	mseAt     []float64 // held-out loss of each round's head (index: round)
	work      []string  // the honest work merged in each round: trainers and microshards
	perRound  float64   // mean seconds per round (validator's history)
	maxRound  float64   // the longest round, seconds
	merged    int       // attacker contributions merged
	honest    int       // honest contributions merged
	credited  int       // delta artifacts credited more than once
	stalled   int       // rounds that took longer than two lease.round_timeouts, or never closed
	deadlined int       // rounds in which a lease was waited out to its deadline
	rejects   map[string]uint64
	quarant   int // attackers quarantined at the end
	honestOut int // honest trainers quarantined at the end
	honestRej int // honest contributions rejected (any reason)

	// Set on attacked rows: their clean run, and the round the loss is compared at.
	clean *matrixRun
	at    int
}

// sameWork is the last round up to which a and b merged the same honest work every round
// (0: already round 1 differs). Up to it both trained the same data (see
// TestOneThirdAttackers).
func sameWork(a, b matrixRun) int {
	n := 0
	for n < min(len(a.work), len(b.work)) && a.work[n] == b.work[n] {
		n++
	}
	return n
}

func envInt(t *testing.T, name string, def int) int {
	if s := os.Getenv(name); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, name)
		require.Positive(t, n, name)
		return n
	}
	return def
}

func TestOneThirdAttackers(t *testing.T) {
	sel := os.Getenv("P2PNODE_ATTACK_MATRIX")
	if sel == "" {
		t.Skip("slow and load-sensitive: set P2PNODE_ATTACK_MATRIX=short (the short form), 1 (the full matrix) or a list of rows")
	}
	runMatrixTable(t, sel, thirdShape, attackKinds)
}

// The half matrix (issue 42 item 3): as many trainers attack as are honest, their peer ids
// and start order mixed with the honest ones', plus a row where they start first.
//
//	P2PNODE_HALF_MATRIX=short go test -race -count=1 -tags attack -run 'TestHalfAttackers$' -v ./node/
//
// P2PNODE_HALF_MATRIX=short runs 4 honest + 4 attackers; =1 the full form, 8 + 8, one row
// at a time; a list of rows runs those rows of the full form. The other variables are
// TestOneThirdAttackers'. Mixed peer ids give the honest trainers other leases than in the
// clean run from round 1, so the loss is compared at the last round (the table's "final"
// column) as well as at the last round of equal honest work where there is one.
//
// It asserts every round reached, none stalled, no delta credited twice, no attacker
// update of a detectable kind merged and no honest trainer quarantined. The other
// goals, the final loss within 2 % of the clean run's and < 2 % of honest updates
// rejected, are asserted from 24 rounds on (P2PNODE_ATTACK_ROUNDS=24), or always with
// P2PNODE_HALF_GOALS=1: in 4 rounds the honest trainers' other leases set the final loss
// (docs/security.md, the half matrix), and in 24 they no longer do.
func TestHalfAttackers(t *testing.T) {
	sel := os.Getenv("P2PNODE_HALF_MATRIX")
	if sel == "" {
		t.Skip("slow and load-sensitive: set P2PNODE_HALF_MATRIX=short (4 + 4), 1 (8 + 8) or a list of rows")
	}
	shape := halfShape
	if sel != "short" && !strings.HasPrefix(sel, "short:") {
		shape = halfFullShape
	}
	runMatrixTable(t, sel, shape, halfKinds)
}

// runMatrixTable runs the rows of kinds that sel selects ("short", "1" or a list of row
// names) in a swarm of the given shape, each beside its clean run, checks them, and logs
// the table.
func runMatrixTable(t *testing.T, sel string, shape matrixShape, kinds []attackKind) {
	// "short:a,b" is the short form's rows a and b; a list alone, the full form's.
	var only []string
	list, short := strings.CutPrefix(sel, "short:")
	full := sel != "short" && !short
	if short || full && sel != "1" {
		only = strings.Split(list, ",")
	}
	rounds, parallel := 4, matrixParallel
	if full {
		rounds, parallel = 8, 1
	}
	rounds = envInt(t, "P2PNODE_ATTACK_ROUNDS", rounds)
	// The mixed shape's goals that compare with the clean run's different leases.
	mixedGoals := rounds >= 24 || os.Getenv("P2PNODE_HALF_GOALS") != ""
	parallel = envInt(t, "P2PNODE_ATTACK_PARALLEL", parallel)
	var (
		mu     sync.Mutex
		rows   = map[string]matrixRun{}
		slot   = make(chan struct{}, parallel)
		cleans = map[byte]matrixRun{}
	)
	// cleanRun is the clean run on the peer ids of salt, run once. Rows side by side need
	// peer ids of their own (each cluster its own, or their logs cannot be told apart), and
	// a clean run on other peer ids than the row's is no reference: its trainers' seeds
	// differ, and from round 2 on its data (see above).
	cleanRun := func(t *testing.T, salt byte) matrixRun {
		mu.Lock()
		c, ok := cleans[salt]
		mu.Unlock()
		if ok {
			return c
		}
		c = runMatrix(t, attackKind{name: "clean"}, rounds, salt, shape)
		t.Logf("clean (peer ids %d): %d rounds, mse %.6g, %.2f s/round", salt, c.rounds, c.mse, c.perRound)
		require.Equal(t, rounds, c.rounds, "the clean run reached every round")
		mu.Lock()
		cleans[salt] = c
		mu.Unlock()
		return c
	}
	if parallel == 1 {
		cleanRun(t, 0)
	}
	// The mixed shape's loss goal compares runs whose honest trainers trained other
	// microshards in other rounds (an attacker turned away gives its microshards back to the
	// pool), and the synthetic workload's final loss moves with that schedule alone: rows
	// with no attacker update merged ended up to 3 % from the clean run (docs/security.md).
	// Clean runs on peer ids of their own (other leases and seeds, the same amount of
	// honest work) show how far the schedule alone moves the final loss: the goal is 2 %, or
	// the farthest of them above the clean run if that is more. (The mean over the last
	// third of the rounds moves more with the schedule, not less: up to +6.6 % with no
	// attacker update merged, clean runs up to +3.8 %; the loss still falls there.)
	lossLimit := 2.0
	var band []float64
	if shape.mixed && mixedGoals {
		base := cleanRun(t, 0)
		for j := range envInt(t, "P2PNODE_ATTACK_CLEANS", 8) {
			c := cleanRun(t, byte(200+j))
			band = append(band, pct(c.mse, base.mse))
			lossLimit = max(lossLimit, band[j])
		}
		t.Logf("clean runs on other peer ids against the clean run's final loss: %s; loss goal %+.2f %%", fmtPcts(band), lossLimit)
	}
	t.Run("rows", func(t *testing.T) {
		for i, k := range kinds {
			salt := byte(0)
			if parallel > 1 {
				salt = byte(1 + i)
			}
			t.Run(k.name, func(t *testing.T) {
				if only != nil && !slices.Contains(only, k.name) {
					t.Skip("not selected in P2PNODE_ATTACK_MATRIX / P2PNODE_HALF_MATRIX")
				}
				t.Parallel()
				slot <- struct{}{}
				release := sync.OnceFunc(func() { <-slot })
				defer release() // also when a run fails
				clean := cleanRun(t, salt)
				r := runMatrix(t, k, rounds, salt, shape)
				release()
				r.clean, r.at = &clean, sameWork(r, clean)
				mu.Lock()
				rows[k.name] = r
				mu.Unlock()
				t.Logf("%s: merged %d, credited twice %d, stalled %d, at deadline %d, mse %.6g (final %+.2f%% vs clean), at round %d %+.2f%% (%.6g, clean %.6g), honest merged %d (clean %d), honest rejected %d, %.2f s/round (clean %.2f), rejections %v, quarantined %d, honest quarantined %d",
					k.name, r.merged, r.credited, r.stalled, r.deadlined, r.mse, pct(r.mse, clean.mse), r.at, pct(r.mseAt[r.at], clean.mseAt[r.at]), r.mseAt[r.at], clean.mseAt[r.at],
					r.honest, clean.honest, r.honestRej, r.perRound, clean.perRound, r.rejects, r.quarant, r.honestOut)
				// Every goal is checked, so that a failing row reports all it missed.
				assert.Equal(t, rounds, r.rounds, "the chain reached every round")
				assert.Zero(t, r.credited, "a delta credited more than once")
				assert.Zero(t, r.stalled, "rounds stalled")
				if k.subtle {
					// Built to pass screening: what is merged is measured, not asserted
					// (docs/security.md); at a half, the loss goal holds for them too.
					if shape.mixed && mixedGoals {
						assert.LessOrEqual(t, pct(r.mse, clean.mse), lossLimit, "final held-out loss farther above the clean run's than the loss goal")
					}
					return
				}
				if k.bus == busCopy {
					// The goal for a free rider: its copy is credited once at most
					// (credited, below). Gossip does not order an original before its copy,
					// and the validator credits a delta to the first claim it accepts, so
					// now and then the copier is credited instead of the original's
					// trainer: the model merges the same update either way.
					if r.merged > 0 {
						t.Logf("%s: %d copies credited to their copier instead of the original's trainer", k.name, r.merged)
					}
				} else {
					assert.Zero(t, r.merged, "attacker updates merged")
				}
				assert.Zero(t, r.honestOut, "honest trainers quarantined")
				if shape.mixed && mixedGoals {
					assert.Less(t, 100*float64(r.honestRej), 2*float64(r.honestRej+r.honest), "honest updates rejected: 2 %% or more")
					assert.LessOrEqual(t, pct(r.mse, clean.mse), lossLimit, "final held-out loss farther above the clean run's than the loss goal")
				}
				// Ending better than the clean run would be no harm, so the check is one-sided;
				// on the same honest work the two are equal unless an attacker update merged.
				if r.at > 0 {
					assert.LessOrEqual(t, r.mseAt[r.at], 1.02*clean.mseAt[r.at],
						"held-out loss at round %d, the last with the same honest work as the clean run, more than 2%% worse than the clean run's", r.at)
				}
				if r.at < min(r.rounds, clean.rounds) {
					t.Logf("%s: round %d merged other honest work than the clean run (the loss is compared at round %d): %s (clean %s)",
						k.name, r.at+1, r.at, r.work[r.at], clean.work[r.at])
				}
			})
		}
	})
	var ordered []matrixRun
	for _, k := range kinds {
		if r, ok := rows[k.name]; ok {
			ordered = append(ordered, r)
		}
	}
	table := matrixTable(ordered, rounds, parallel, shape)
	if band != nil {
		table += fmt.Sprintf("\nClean runs on %d other sets of peer ids, final held-out mse against the clean run's: %s; the loss goal: %+.2f %%.\n", len(band), fmtPcts(band), lossLimit)
	}
	t.Log("\n" + table)
	if p := os.Getenv("P2PNODE_ATTACK_TABLE"); p != "" {
		require.NoError(t, os.WriteFile(p, []byte(table), 0o644))
	}
}

func pct(x, ref float64) float64 { return 100 * (x - ref) / ref }

func fmtPcts(xs []float64) string {
	var out []string
	for _, x := range xs {
		out = append(out, fmt.Sprintf("%+.2f %%", x))
	}
	return strings.Join(out, ", ")
}

func matrixTable(rows []matrixRun, rounds, parallel int, shape matrixShape) string {
	var b strings.Builder
	order := "attackers' peer ids sort last"
	if shape.mixed {
		order = "attackers' peer ids and start order mixed with the honest ones'"
	}
	fmt.Fprintf(&b, "%d trainers (%d attacking; %s), 1 validator, %d rounds, %d rows at a time, synthetic workload on mocknet; each row against a clean run of its %d honest trainers alone on the same peer ids (in brackets)\n\n",
		shape.honest+shape.attackers, shape.attackers, order, rounds, parallel, shape.honest)
	b.WriteString("| attack | attacker updates merged | deltas credited twice | rounds stalled | rounds that waited out a deadline | held-out mse vs clean (at round) | final held-out mse vs clean | honest updates merged (clean) | honest updates rejected | s/round (clean) | longest round s | rejections | attackers quarantined | honest quarantined |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		var rj []string
		for _, k := range sortedKeys(r.rejects) {
			rj = append(rj, fmt.Sprintf("%s %d", k, r.rejects[k]))
		}
		loss := "— (0)"
		if r.at > 0 {
			loss = fmt.Sprintf("%+.2f %% (%d)", pct(r.mseAt[r.at], r.clean.mseAt[r.at]), r.at)
		}
		rejPct := 0.0
		if n := r.honestRej + r.honest; n > 0 {
			rejPct = 100 * float64(r.honestRej) / float64(n)
		}
		final := fmt.Sprintf("%+.2f %%", pct(r.mse, r.clean.mse))
		if math.Abs(pct(r.mse, r.clean.mse)) >= 1000 {
			final = fmt.Sprintf("%+.2g %%", pct(r.mse, r.clean.mse))
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %s | %s | %d (%d) | %d (%.1f %%) | %.2f (%.2f) | %.2f | %s | %d of %d | %d of %d |\n",
			attackLabels[r.kind], r.merged, r.credited, r.stalled, r.deadlined, loss, final, r.honest, r.clean.honest, r.honestRej, rejPct,
			r.perRound, r.clean.perRound, r.maxRound, strings.Join(rj, ", "), r.quarant, shape.attackers, r.honestOut, shape.honest)
	}
	return b.String()
}

// nodeName is the name of c's node with the peer id (the id itself if none has it).
func nodeName(c *cluster, peer string) string {
	for _, n := range c.nodes {
		if n.host.ID().String() == peer {
			return n.name
		}
	}
	return peer
}

func sortedKeys(m map[string]uint64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

var (
	deadlineRound   = regexp.MustCompile(`trainer did not report by the deadline.* round=(\d+)`)
	rejectedPeer    = regexp.MustCompile(`contribution rejected.* peer=(\S+)`)
	quarantinedPeer = regexp.MustCompile(`peer quarantined.* peer=(\S+)`)
)

// runMatrix runs one validator and the shape's honest trainers, plus its attackers of kind
// k (none for the clean run).
func runMatrix(t *testing.T, k attackKind, rounds int, salt byte, shape matrixShape) matrixRun {
	clean := k.name == "clean"
	trainers := shape.honest + shape.attackers
	if clean && !shape.mixed {
		trainers = shape.honest
	}
	// Rows that run at the same time need their own peer ids: with the same ones, one
	// cluster's announcements reached another's validator (seen as restarts, every lease
	// given up; how they cross mocknets is not known). Sequential runs share the clean
	// run's ids, so their leases go as in it. In a mixed shape the clean run has the
	// attackers' hosts too, never started, so that the honest ones have the same ids.
	sortLast := 1 + shape.honest
	if shape.mixed {
		sortLast = 1 + trainers
	}
	c := newClusterSalted(t, salt, 1, trainers, rounds, 64, sortLast)
	isAttacker := func(i int) bool { return i > 0 && shape.attacker(i-1) }
	for i, n := range c.nodes {
		// Screening at its defaults (min_cosine 0, the noise bar 4/√520 ≈ 0.175 of the
		// synthetic workload's 520 parameters once a round's updates agree).
		n.cfg.Lease.RoundTimeout = matrixTimeout
		// Every attempt gets 10 s: with 4 s, under -race on a loaded 2-core machine the
		// honest trainers of a 10-node cluster missed whole attempts (received 0 of 9 at
		// the deadline), and the rows measured the machine, not the attackers.
		n.cfg.Lease.MinDeadline = 10 * time.Second
		n.cfg.Lease.MicroshardsPerTrainer = 1
		n.cfg.Lease.MinGroup = shape.honest
		// The validator keeps every head's parameters: the loss is compared at a round
		// before the last (see TestOneThirdAttackers).
		n.cfg.Node.Archive = i == 0
		// A slow learner keeps honest updates pointing the same way for the whole run, so
		// the cosine check can tell noise from signal.
		n.rt.LR = 0.01
		n.rt.Delay = 50 * time.Millisecond
		if isAttacker(i) && !clean {
			n.name = fmt.Sprintf("attacker-%s-%d", k.name, i)
			if k.poison != "" {
				n.extra = append(n.extra, attackOption(k.poison))
			}
			if k.bus != "" {
				n.extra = append(n.extra, attackBusOption(k.bus))
			}
		}
	}
	v := c.nodes[0]
	v.logs = &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("P2PNODE_ATTACK_LOGS") != "" {
			var lines []string
			for _, l := range strings.Split(v.logs.String(), "\n") {
				if !strings.Contains(l, "pkg=gossip") {
					lines = append(lines, l)
				}
			}
			t.Logf("validator log, gossip left out (last 300 lines):\n%s", strings.Join(lines[max(0, len(lines)-300):], "\n"))
		}
	})
	var attackers, honest []*clusterNode
	for i, n := range c.nodes[1:] {
		if isAttacker(i + 1) {
			if !clean {
				attackers = append(attackers, n)
			}
		} else {
			honest = append(honest, n)
		}
	}
	if k.first {
		// The attackers own the young chain: they and the validator start, and the honest
		// trainers only once round 2 is merged, or once the validator has turned the
		// attackers' round 1 away (its reference screening does): a chain nobody honest
		// trains cannot advance, and the time it waits for the first honest trainer is
		// the volunteers' absence, not a stall the attackers caused. A minute at most: the
		// leases wait for lease.min_group, which the attackers alone meet.
		for _, n := range attackers {
			c.start(n)
		}
		c.waitAnnounced(attackers)
		c.start(v)
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			st := v.n.Status()
			if st.Round >= 2 || (st.Validator != nil && st.Validator.Rejections["low_cosine"] >= uint64(len(attackers))) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, n := range honest {
			c.start(n)
		}
	} else {
		// Everyone announces before the validator leases round 1, so the attackers are
		// offered leases from the start; in index order, which a mixed shape interleaves.
		var started []*clusterNode
		for i, n := range c.nodes[1:] {
			if !clean || !isAttacker(i+1) {
				c.start(n)
				started = append(started, n)
			}
		}
		c.waitAnnounced(started)
		c.start(v)
	}
	c.waitDoneOf(slices.Concat([]*clusterNode{v}, honest, attackers), 3*time.Minute)

	out := matrixRun{kind: k.name}
	st := v.n.Status()
	ids, heads := c.chainOf(v)
	out.rounds = len(ids) - 1
	stores, err := OpenStores(v.cfg)
	require.NoError(t, err)
	eval := synth.New(t.TempDir())
	for _, h := range heads {
		params, err := h.ParamsID()
		require.NoError(t, err)
		m, err := eval.Evaluate(context.Background(), stores.Artifacts.BlobPath(params))
		require.NoError(t, err, "round %d", h.Round)
		out.mseAt = append(out.mseAt, m["mse"])
	}
	out.mse = out.mseAt[len(out.mseAt)-1]

	bad := map[string]bool{}
	for _, n := range attackers {
		bad[n.host.ID().String()] = true
	}
	credit := map[string]int{}
	for _, h := range heads[1:] {
		var work []string
		for _, ct := range h.Contributions {
			if bad[ct.Peer] {
				out.merged++
			} else {
				out.honest++
				work = append(work, fmt.Sprintf("%s:%v", nodeName(c, ct.Peer), ct.Microshards))
			}
			credit[string(ct.Artifact)]++
		}
		slices.Sort(work)
		out.work = append(out.work, strings.Join(work, " "))
	}
	for _, n := range credit {
		if n > 1 {
			out.credited++
		}
	}
	var sum float64
	for _, p := range st.History {
		if p.Round == 0 {
			continue
		}
		sum += p.Seconds
		out.maxRound = max(out.maxRound, p.Seconds)
		// One attempt may wait out its deadline (a validator cannot know that a silent
		// trainer will never report); a round that needs more than two is held hostage.
		if p.Seconds > 2*matrixTimeout.Seconds() {
			out.stalled++
		}
	}
	if n := len(st.History); n > 0 {
		out.perRound = sum / float64(out.rounds)
	}
	out.stalled += rounds - out.rounds
	waited := map[string]bool{}
	for _, mt := range deadlineRound.FindAllStringSubmatch(v.logs.String(), -1) {
		waited[mt[1]] = true
	}
	out.deadlined = len(waited)
	if st.Validator != nil {
		out.rejects = st.Validator.Rejections
	}
	for _, mt := range rejectedPeer.FindAllStringSubmatch(v.logs.String(), -1) {
		if !bad[mt[1]] {
			out.honestRej++
		}
	}
	quarantined := map[string]bool{}
	for _, mt := range quarantinedPeer.FindAllStringSubmatch(v.logs.String(), -1) {
		quarantined[mt[1]] = true
	}
	for p := range quarantined {
		if bad[p] {
			out.quarant++
		} else {
			out.honestOut++
		}
	}
	return out
}
