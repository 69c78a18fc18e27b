package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/internal/testenv"
)

// chromium finds Debian's headless-capable Chromium (scripts/setup.sh installs it).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Missing(t, "no chromium on PATH (run `make setup`)")
	return ""
}

// headless runs Chromium against url with a few seconds for the page's scripts, and
// returns the rendered DOM (with --dump-dom) or writes a screenshot.
func headless(t *testing.T, browser string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--user-data-dir=" + t.TempDir(), "--virtual-time-budget=4000", "--window-size=1280,2400"}
	out, err := exec.CommandContext(ctx, browser, append(base, args...)...).Output()
	if err != nil {
		t.Fatalf("%s %v: %v", browser, args, err)
	}
	return out
}

var (
	peerRowRe    = regexp.MustCompile(`<tr class="peer" data-peer="([^"$]+)">(.*?)</tr>`) // not the script's template
	cellRe       = regexp.MustCompile(`<td[^>]*>(.*?)</td>`)
	tagRe        = regexp.MustCompile(`<[^>]+>`)
	scriptRe     = regexp.MustCompile(`(?s)<script>.*?</script>`)
	workerRe     = regexp.MustCompile(`(?s)<table id="worker">.*?</table>`)
	leasesRe     = regexp.MustCompile(`(?s)<div id="leases">.*?</div>`)
	contribRowRe = regexp.MustCompile(`<tr class="contributor" data-peer="([^"$]+)">(.*?)</tr>`)
	creditRe     = regexp.MustCompile(`<b id="credit-summary">merged (\d+) \(\d+ samples\), rejected \d+`) // a trainer's own account
	overlapRe    = regexp.MustCompile(`overlap: (\d+) of \d+ windows trained ahead`)                       // a trainer's windows trained ahead
)

// rendered is the page as Chromium rendered it, without the script (whose templates
// would match what the checks look for).
func rendered(t *testing.T, browser, url string) []byte {
	return scriptRe.ReplaceAll(headless(t, browser, "--dump-dom", url), nil)
}

// chartRounds lists the rounds of a chart series' points, in page order.
func chartRounds(dom []byte, series string) []int {
	re := regexp.MustCompile(`<circle class="pt" data-series="` + series + `" data-round="(\d+)"`)
	var out []int
	for _, m := range re.FindAllSubmatch(dom, -1) {
		r, _ := strconv.Atoi(string(m[1]))
		out = append(out, r)
	}
	return out
}

// timedRounds maps each round of the time chart to the parts of its bar.
func timedRounds(dom []byte) map[int][]string {
	re := regexp.MustCompile(`<rect class="seg" data-round="(\d+)" data-part="(\w+)"`)
	out := map[int][]string{}
	for _, m := range re.FindAllSubmatch(dom, -1) {
		r, _ := strconv.Atoi(string(m[1]))
		out[r] = append(out[r], string(m[2]))
	}
	return out
}

// checkHistory checks that the page's charts have every finished round of a node that was
// at round `before` when the page was opened and at `after` once it had rendered: an
// accuracy and a held-out loss point for rounds 0.., a time bar of four parts for rounds
// 1.., and that the last charted round lies between (or is one of the two before
// `before`: a round's point follows its head by a moment). The page reads the node's
// history while it renders, and the swarm can finish several rounds meanwhile (three in
// a CI run, at a tenth of a second a round). It returns the last round.
func checkHistory(t *testing.T, who string, dom []byte, before, after uint64) int {
	t.Helper()
	for _, series := range []string{"heldout_accuracy", "heldout_loss", "train_loss"} {
		rounds := chartRounds(dom, series)
		first := 0
		if series == "train_loss" {
			first = 1 // genesis trained nothing
		}
		if len(rounds) < 3 {
			t.Fatalf("%s: the %s series has %d points, want one per finished round:\n%s", who, series, len(rounds), dom)
		}
		for i, r := range rounds {
			if r != first+i {
				t.Fatalf("%s: the %s series has points for rounds %v, not one per round from %d", who, series, rounds, first)
			}
		}
		if last := uint64(rounds[len(rounds)-1]); last > after || last+2 < before {
			t.Fatalf("%s: the %s series ends at round %d, the node was at round %d before the page was opened and at %d after", who, series, last, before, after)
		}
	}
	last := chartRounds(dom, "heldout_accuracy")
	end := last[len(last)-1]
	timed := timedRounds(dom)
	for r := 1; r <= end; r++ {
		if parts := timed[r]; !slices.Equal(parts, []string{"training", "communication", "merge", "other"}) {
			t.Fatalf("%s: round %d's time bar has parts %v, want training, communication, merge, other (bars for %d rounds)", who, r, parts, len(timed))
		}
	}
	for _, label := range []string{">loss</text>", ">accuracy (%)</text>", ">seconds</text>", ">round</text>"} {
		if !bytes.Contains(dom, []byte(label)) {
			t.Fatalf("%s: no axis labelled %q on the page", who, label)
		}
	}
	return end
}

// TestDashboardInABrowser starts the demo swarm (a validator and two trainers), opens the
// validator's page in headless Chromium and checks what it renders: the loss and accuracy
// charts have a point for every finished round, the time chart a bar split into training,
// communication, merge and the rest for every round, and the peer table has every node with
// its roles. Then a trainer restarts without its history file: its page still charts every
// round, from the chain. The trainers train ahead (protocol.overlap: eager): the other
// trainer's page counts its windows trained ahead. A screenshot of the validator's page is
// saved in e2e/logs/TestDashboardInABrowser/dashboard.png, of the restarted trainer's in
// trainer-after-restart.png.
func TestDashboardInABrowser(t *testing.T) {
	browser := chromium(t)
	dir := t.TempDir()
	// Rounds enough that the run does not end during the test.
	procs := swarm(t, dir, 2, 400, func(_ string, c *config.Config) {
		c.Protocol.InnerSteps = 100
		c.Protocol.Overlap = config.OverlapEager
	})
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	for _, p := range procs {
		p.Start()
	}
	v := procs[0]
	Eventually(t, time.Minute, "every node printing its peer id", func() bool {
		for _, p := range procs {
			if !regexp.MustCompile(`^p2pnode \S+:`).MatchString(p.Output()) {
				return false
			}
		}
		return true
	})
	var ids []string
	for _, p := range procs {
		ids = append(ids, p.peerID(t))
	}
	Eventually(t, 4*time.Minute, "the validator at round 3 with every peer heard from", func() bool {
		s, err := v.Status(context.Background())
		if err != nil || s.Round < 3 {
			return false
		}
		seen := 0
		for _, p := range s.Peers {
			if slices.Contains(ids, p.Peer) && p.Round > 0 {
				seen++
			}
		}
		return seen == len(ids)
	})
	url := pageURL(t, v)
	s0, err := v.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	dom := rendered(t, browser, url)
	s, err := v.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	end := checkHistory(t, "validator", dom, s0.Round, s.Round)

	rows := map[string]string{}
	for _, m := range peerRowRe.FindAllSubmatch(dom, -1) {
		cells := cellRe.FindAllSubmatch(m[2], -1)
		if len(cells) < 4 {
			t.Fatalf("peer row %s has %d cells", m[1], len(cells))
		}
		rows[string(m[1])] = string(tagRe.ReplaceAll(cells[1][1], nil)) + " " + string(tagRe.ReplaceAll(cells[3][1], nil))
	}
	for i, id := range ids {
		want := "trainer"
		if i == 0 {
			want = "validator"
		}
		if !strings.Contains(rows[id], want) || !regexp.MustCompile(`now|s ago`).MatchString(rows[id]) {
			t.Fatalf("the peer table's row for %s (%s) says %q, want its roles (%s) and when it was last seen; rows: %v", id, procs[i].Name, rows[id], want, rows)
		}
	}
	if len(rows) != len(ids) {
		t.Fatalf("the peer table lists %d peers, want every node %v: %v", len(rows), ids, rows)
	}
	for _, want := range []string{"validator: <b>", "leading round", "quarantine", "<th>state</th>"} {
		if !bytes.Contains(dom, []byte(want)) {
			t.Fatalf("the page has no %q (the validator's phase, leases, quarantine, the worker card)", want)
		}
	}
	// The contributors panel lists every trainer the chain merged, with its count.
	contrib := map[string]string{}
	for _, m := range contribRowRe.FindAllSubmatch(dom, -1) {
		contrib[string(m[1])] = string(tagRe.ReplaceAll(m[2], nil))
	}
	for i, id := range ids[1:] {
		if !regexp.MustCompile(`^\S+( \(this node\))?[1-9]\d*`).MatchString(contrib[id]) {
			t.Fatalf("the contributors panel has no row for %s (%s) with its merged count: %q", id, procs[i+1].Name, contrib)
		}
	}
	card := workerRe.Find(dom)
	if bytes.ContainsAny(card, "{}") || !regexp.MustCompile(`<th>last call</th><td[^>]*>\w+, \d+(\.\d+)? m?s, `).Match(card) {
		t.Fatalf("the worker card is not formatted (raw JSON, a duration in ns): %s", card)
	}

	// A trainer restarted without its history file shows every round: the history is the
	// chain's, with the round notes its heads carry.
	tr := procs[1]
	if err := tr.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(tr.Cfg.Node.StoreDir, "history.jsonl")); err != nil {
		t.Fatal(err)
	}
	tr.Start()
	Eventually(t, 2*time.Minute, "the restarted trainer back at the validator's round", func() bool {
		vs, err1 := v.Status(context.Background())
		ts, err2 := tr.Status(context.Background())
		return err1 == nil && err2 == nil && ts.Round > uint64(end) && ts.Round+1 >= vs.Round
	})
	ts0, err := tr.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tdom := rendered(t, browser, pageURL(t, tr))
	ts, err := tr.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tend := checkHistory(t, "restarted trainer", tdom, ts0.Round, ts.Round)
	if m := creditRe.FindSubmatch(tdom); m == nil || m[1][0] == '0' {
		t.Fatalf("the trainer's page does not say what of its work was merged: %s", creditRe.Find(tdom))
	}
	odom := rendered(t, browser, pageURL(t, procs[2]))
	if m := overlapRe.FindSubmatch(odom); m == nil || string(m[1]) == "0" {
		t.Fatalf("the page of %s does not count windows trained ahead (want at least one): %s", procs[2].Name, leasesRe.Find(odom))
	}

	shots := filepath.Join(RepoRoot(), "e2e", "logs", t.Name())
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, u := range map[string]string{"dashboard.png": url, "trainer-after-restart.png": pageURL(t, tr)} {
		shot := filepath.Join(shots, name)
		_ = os.Remove(shot)
		headless(t, browser, "--screenshot="+shot, u)
		if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
			t.Fatalf("no screenshot at %s: %v", shot, err)
		}
	}
	t.Logf("validator's page: rounds 0..%d charted, %d peers; restarted trainer's page: rounds 0..%d; screenshots in %s", end, len(rows), tend, shots)
}

// pageURL is the dashboard of a running node (its HTTP address from the store).
func pageURL(t *testing.T, p *Proc) string {
	t.Helper()
	var addr string
	Eventually(t, time.Minute, p.Name+" writing its HTTP address", func() bool {
		b, _ := os.ReadFile(filepath.Join(p.Cfg.Node.StoreDir, "http.addr"))
		addr = string(regexp.MustCompile(`\S+`).Find(b))
		return addr != ""
	})
	return "http://" + addr + "/"
}
