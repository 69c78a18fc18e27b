package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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
		"--no-first-run", "--user-data-dir=" + t.TempDir(), "--virtual-time-budget=4000", "--window-size=1280,1800"}
	out, err := exec.CommandContext(ctx, browser, append(base, args...)...).Output()
	if err != nil {
		t.Fatalf("%s %v: %v", browser, args, err)
	}
	return out
}

var (
	pointRe = regexp.MustCompile(`<circle class="pt" data-series="heldout_accuracy" data-round="(\d+)"`)
	peerRe  = regexp.MustCompile(`<tr class="peer" data-peer="([^"$]+)"`) // not the script's template
)

// TestDashboardInABrowser starts the demo swarm (a validator and two trainers), opens the
// validator's page in headless Chromium and checks what it renders: the accuracy chart
// has a point for every finished round and the peer table has every node. A screenshot
// is saved in e2e/logs/TestDashboardInABrowser/dashboard.png.
func TestDashboardInABrowser(t *testing.T) {
	browser := chromium(t)
	dir := t.TempDir()
	procs := swarm(t, dir, 2, 40, func(_ string, c *config.Config) { c.Protocol.InnerSteps = 100 })
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
	var addr string
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
		b, _ := os.ReadFile(filepath.Join(v.Cfg.Node.StoreDir, "http.addr"))
		addr = string(regexp.MustCompile(`\S+`).Find(b))
		return seen == len(ids)
	})
	url := "http://" + addr + "/"
	dom := headless(t, browser, "--dump-dom", url)
	s, err := v.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	var rounds []int
	for _, m := range pointRe.FindAllSubmatch(dom, -1) {
		r, _ := strconv.Atoi(string(m[1]))
		rounds = append(rounds, r)
	}
	if len(rounds) < 4 {
		t.Fatalf("the accuracy chart has %d points, want one per finished round (>= 4):\n%s", len(rounds), dom)
	}
	for i, r := range rounds {
		if r != i {
			t.Fatalf("the accuracy chart's points are rounds %v: not one per round from 0", rounds)
		}
	}
	if last := uint64(rounds[len(rounds)-1]); last > s.Round || last+2 < s.Round {
		t.Fatalf("the chart ends at round %d, the node is at round %d", last, s.Round)
	}
	var peers []string
	for _, m := range peerRe.FindAllSubmatch(dom, -1) {
		peers = append(peers, string(m[1]))
	}
	slices.Sort(peers)
	slices.Sort(ids)
	if !slices.Equal(peers, ids) {
		t.Fatalf("the peer table lists %v, want every node %v", peers, ids)
	}

	shots := filepath.Join(RepoRoot(), "e2e", "logs", t.Name())
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(shots, "dashboard.png")
	_ = os.Remove(shot)
	headless(t, browser, "--screenshot="+shot, url)
	if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
		t.Fatalf("no screenshot at %s: %v", shot, err)
	}
	t.Logf("accuracy chart: rounds 0..%d; peers: %d; screenshot %s", rounds[len(rounds)-1], len(peers), shot)
}
