//go:build e2e

package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/chain"
	dfleet "github.com/p2pnode/p2pnode/docker/fleet"
	"github.com/p2pnode/p2pnode/internal/testenv"
	"github.com/p2pnode/p2pnode/node"
	"github.com/p2pnode/p2pnode/status"
)

// The docker-compose harness: a fleet from e2e/compose*.yaml under a project name of its
// own, configured by files written with docker/fleet, always torn down with its volumes,
// with every container's logs saved under e2e/logs/<test>/ when the test fails. Nodes are
// reached with `docker exec <container> p2pnode status --addr 127.0.0.1:8080 --json`: no
// port is published and the fleet's network is internal.

// image is the p2pnode image the fleet runs (`make image` builds it).
func image() string {
	if s := os.Getenv("P2PNODE_IMAGE"); s != "" {
		return s
	}
	return "p2pnode:latest"
}

var dockerState = sync.OnceValues(func() ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := exec.CommandContext(ctx, "docker", "info").Run(); err != nil {
		return nil, fmt.Errorf("no Docker engine answers (docker info: %v)", err)
	}
	if err := exec.CommandContext(ctx, "docker", "image", "inspect", image()).Run(); err != nil {
		return nil, fmt.Errorf("image %s is missing: run `make image`", image())
	}
	removeStaleProjects()
	// Whichever compose answers: the v2 plugin or Debian's docker-compose 1.29.
	if exec.CommandContext(ctx, "docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}, nil
	}
	if exec.CommandContext(ctx, "docker-compose", "version").Run() == nil {
		return []string{"docker-compose"}, nil
	}
	return nil, errors.New("neither `docker compose` nor `docker-compose` answers")
})

const projectPrefix = "p2pe2e-"

// removeStaleProjects removes the containers, volumes and networks of e2e projects whose
// test process is gone (a run killed by `go test -timeout` skips its cleanups).
func removeStaleProjects() {
	out, err := exec.Command("docker", "ps", "-a", "--filter", "label=com.docker.compose.project",
		"--format", `{{.Label "com.docker.compose.project"}}`).Output()
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		rest, ok := strings.CutPrefix(p, projectPrefix)
		if !ok || seen[p] {
			continue
		}
		seen[p] = true
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue // not ours, or its test process still runs
		}
		label := "label=com.docker.compose.project=" + p
		for _, kind := range [][]string{{"ps", "-aq"}, {"volume", "ls", "-q"}, {"network", "ls", "-q"}} {
			ids, _ := exec.Command("docker", append(kind, "--filter", label)...).Output()
			if len(strings.Fields(string(ids))) == 0 {
				continue
			}
			rm := map[string][]string{"ps": {"rm", "-f", "-v"}, "volume": {"volume", "rm", "-f"}, "network": {"network", "rm"}}[kind[0]]
			_ = exec.Command("docker", append(rm, strings.Fields(string(ids))...)...).Run()
		}
	}
}

// requireDocker skips the test when there is no engine, image or compose.
func requireDocker(t *testing.T) []string {
	t.Helper()
	c, err := dockerState()
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	return c
}

// fleetOptions shape one scenario's fleet.
type fleetOptions struct {
	Trainers     int // trainer configs written (the compose files decide how many run)
	InnerSteps   int
	RoundTimeout time.Duration
	MinGroup     int
	MaxNorm      float64
	Overlays     []string // e.g. "compose.scale.yaml"
	Env          []string // extra compose variables, e.g. P2PNODE_POISON=nan
	// Workload and WorkloadConfig pick another workload than digits (see docker/fleet).
	Workload       string
	WorkloadConfig map[string]any
}

// composeFleet is one compose project run by a test.
type composeFleet struct {
	t       *testing.T
	compose []string
	project string
	files   []string
	env     []string
	Fleet   *dfleet.Fleet
	ids     sync.Map // service -> container id
	start   time.Time
}

var projectChars = regexp.MustCompile(`[^a-z0-9]+`)

func newFleet(t *testing.T, o fleetOptions) *composeFleet {
	t.Helper()
	compose := requireDocker(t)
	if o.Trainers == 0 {
		o.Trainers = 8
	}
	f, err := dfleet.Write(dfleet.Options{Dir: filepath.Join(t.TempDir(), "fleet"), Trainers: o.Trainers,
		InnerSteps: o.InnerSteps, RoundTimeout: o.RoundTimeout, MinGroup: o.MinGroup, MaxNorm: o.MaxNorm, Attacker: true,
		Workload: o.Workload, WorkloadConfig: o.WorkloadConfig})
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Trim(projectChars.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	// The pid lets a later run remove what a killed run left behind (removeStaleProjects).
	project := fmt.Sprintf("%s%d-%s", projectPrefix, os.Getpid(), name)
	files := []string{"compose.yaml"}
	files = append(files, o.Overlays...)
	env := append([]string{"P2PNODE_FLEET=" + f.Dir, "P2PNODE_IMAGE=" + image()}, o.Env...)
	c := &composeFleet{t: t, compose: compose, project: project, files: files, env: env, Fleet: f, start: time.Now()}
	t.Cleanup(c.teardown)
	return c
}

// run runs a compose command on the project and returns its combined output.
func (c *composeFleet) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	full := append(slices.Clone(c.compose[1:]), "-p", c.project)
	for _, f := range c.files {
		full = append(full, "-f", f)
	}
	full = append(full, args...)
	cmd := exec.CommandContext(ctx, c.compose[0], full...)
	cmd.Dir = filepath.Join(RepoRoot(), "e2e")
	cmd.Env = append(os.Environ(), c.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", c.compose[0], strings.Join(full, " "), err, out)
	}
	return string(out), nil
}

// up starts services (all of the files' when none are named) and waits for compose's
// depends_on conditions: the dataset prepared, the validator healthy.
func (c *composeFleet) up(services ...string) {
	c.t.Helper()
	start := time.Now()
	if _, err := c.run(5*time.Minute, append([]string{"up", "-d"}, services...)...); err != nil {
		c.t.Fatal(err)
	}
	c.t.Logf("%s up in %s", c.project, time.Since(start).Round(100*time.Millisecond))
}

// teardown fails the test if a container exited with an error, saves every container's
// logs when the test failed, then removes the project with its volumes, whatever happened.
func (c *composeFleet) teardown() {
	// A node exits non-zero on failure: none may have, whatever the scenario asserted.
	if bad := c.failedContainers(); len(bad) > 0 {
		c.t.Errorf("containers exited with an error: %v", bad)
	}
	if c.t.Failed() {
		c.saveLogs()
	}
	if out, err := c.run(3*time.Minute, "down", "-v", "--remove-orphans", "-t", "5"); err != nil {
		c.t.Logf("teardown: %v\n%s", err, out)
	}
	c.t.Logf("%s: %s from configs to teardown", c.project, time.Since(c.start).Round(time.Second))
}

// containers lists the project's containers (running or not) by service.
func (c *composeFleet) containers() map[string]string {
	out, err := exec.Command("docker", "ps", "-a", "--filter", "label=com.docker.compose.project="+c.project,
		"--format", `{{.ID}} {{.Label "com.docker.compose.service"}}`).Output()
	if err != nil {
		return nil
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if id, svc, ok := strings.Cut(line, " "); ok {
			m[svc] = id
		}
	}
	return m
}

func (c *composeFleet) saveLogs() {
	dir := filepath.Join(RepoRoot(), "e2e", "logs", strings.ReplaceAll(c.t.Name(), "/", "_"))
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.t.Logf("save logs: %v", err)
		return
	}
	ctrs := c.containers()
	var running []string
	for svc, id := range ctrs {
		state, _ := exec.Command("docker", "inspect", "-f", "{{json .State}}", id).Output()
		_ = os.WriteFile(filepath.Join(dir, svc+".state.json"), state, 0o644)
		if st, err := c.statusRaw(svc); err == nil {
			_ = os.WriteFile(filepath.Join(dir, svc+".status.json"), st, 0o644)
		}
		if bytes.Contains(state, []byte(`"Running":true`)) {
			running = append(running, id)
		}
	}
	// SIGQUIT makes each node that still runs print every goroutine's stack to its log and
	// exit: what a hung node was waiting for is then in its log.
	if len(running) > 0 {
		_ = exec.Command("docker", append([]string{"kill", "-s", "QUIT"}, running...)...).Run()
		wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = exec.CommandContext(wctx, "docker", append([]string{"wait"}, running...)...).Run()
		cancel()
	}
	for svc, id := range ctrs {
		logs, _ := exec.Command("docker", "logs", "--timestamps", id).CombinedOutput()
		_ = os.WriteFile(filepath.Join(dir, svc+".log"), logs, 0o644)
	}
	c.t.Logf("container logs (with goroutine dumps of the nodes still running) saved in %s", dir)
}

// id is the container of a service (stable across docker stop/start/kill).
func (c *composeFleet) id(svc string) string {
	c.t.Helper()
	if v, ok := c.ids.Load(svc); ok {
		return v.(string)
	}
	id, ok := c.containers()[svc]
	if !ok {
		c.t.Fatalf("no container for service %s in %s", svc, c.project)
	}
	c.ids.Store(svc, id)
	return id
}

// docker runs a docker command and fails the test on error.
func (c *composeFleet) docker(args ...string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// exec runs p2pnode (or anything) inside a service's container.
func (c *composeFleet) exec(svc string, timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", append([]string{"exec", c.id(svc)}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s: %s: %w: %s", svc, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func (c *composeFleet) statusRaw(svc string) ([]byte, error) {
	return c.exec(svc, 15*time.Second, "p2pnode", "status", "--addr", fmt.Sprintf("127.0.0.1:%d", dfleet.HTTPPort), "--json")
}

// status is a service's /status.
func (c *composeFleet) status(svc string) (*status.Status, error) {
	b, err := c.statusRaw(svc)
	if err != nil {
		return nil, err
	}
	var s status.Status
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: status: %w", svc, err)
	}
	return &s, nil
}

// statuses reads several services' status at once (one sweep).
func (c *composeFleet) statuses(svcs []string) ([]*status.Status, error) {
	out := make([]*status.Status, len(svcs))
	errs := make([]error, len(svcs))
	var wg sync.WaitGroup
	for i, s := range svcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = c.status(s)
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// waitFor polls a service's status until cond holds.
func (c *composeFleet) waitFor(svc string, timeout time.Duration, what string, cond func(*status.Status) bool) *status.Status {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		s, err := c.status(svc)
		if err == nil && cond(s) {
			return s
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			round := "no status"
			if s != nil {
				round = fmt.Sprintf("at round %d", s.Round)
			}
			c.t.Fatalf("%s: timed out after %s waiting for %s (%s; last error: %v)", svc, timeout, what, round, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitRound waits until a service's canonical head is at round r or later.
func (c *composeFleet) waitRound(svc string, r uint64, timeout time.Duration) *status.Status {
	c.t.Helper()
	return c.waitFor(svc, timeout, fmt.Sprintf("round %d", r), func(s *status.Status) bool { return s.Head != "" && s.Round >= r })
}

// sameHead polls every service until one sweep finds them all on the same head (rounds
// keep closing meanwhile, so a sweep may straddle a new head).
func (c *composeFleet) sameHead(svcs []string, timeout time.Duration) (string, uint64, []*status.Status) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var seen string
	for {
		sts, err := c.statuses(svcs)
		if err == nil {
			heads := map[string]bool{}
			var parts []string
			for i, s := range sts {
				heads[s.Head] = true
				parts = append(parts, fmt.Sprintf("%s@%d", svcs[i], s.Round))
			}
			if len(heads) == 1 && sts[0].Head != "" {
				return sts[0].Head, sts[0].Round, sts
			}
			seen = strings.Join(parts, " ")
		} else {
			seen = err.Error()
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after %s waiting for %v to report the same head; last sweep: %s", timeout, svcs, seen)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// copyOut copies a path out of a service's container (running or stopped) into dir.
func (c *composeFleet) copyOut(svc, path, dir string) {
	c.t.Helper()
	c.docker("cp", c.id(svc)+":"+path, dir)
}

// readFile reads one file from a service's container (running or stopped).
func (c *composeFleet) readFile(svc, path string) string {
	c.t.Helper()
	out, err := exec.Command("docker", "cp", c.id(svc)+":"+path, "-").Output()
	if err != nil {
		c.t.Fatalf("docker cp %s:%s: %v", svc, path, err)
	}
	tr := tar.NewReader(bytes.NewReader(out))
	if _, err := tr.Next(); err != nil {
		c.t.Fatalf("docker cp %s:%s: %v", svc, path, err)
	}
	b, err := io.ReadAll(tr)
	if err != nil {
		c.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// chain reads a service's canonical chain (genesis first) from a copy of its store.
func (c *composeFleet) chain(svc string) ([]cid.Cid, []*chain.Head) {
	c.t.Helper()
	// The tip first: a head is stored before it becomes the tip, so the heads copied after
	// it include its chain even while the node runs.
	tip, err := cid.Decode(c.readFile(svc, "/data/"+node.TipFile))
	if err != nil {
		c.t.Fatalf("%s: tip: %v", svc, err)
	}
	dir := c.t.TempDir()
	c.copyOut(svc, "/data/heads", dir)
	st, err := chain.OpenStore(filepath.Join(dir, "heads"))
	if err != nil {
		c.t.Fatal(err)
	}
	ids, heads, err := st.Chain(tip)
	if err != nil {
		c.t.Fatalf("%s: chain from %s: %v", svc, tip, err)
	}
	return ids, heads
}

// audit runs `p2pnode audit` on a service's store and returns its report.
func (c *composeFleet) audit(svc string) map[string]any {
	c.t.Helper()
	out, err := c.exec(svc, time.Minute, "p2pnode", "audit", "--config", "/config/"+svc+".yaml")
	var rep map[string]any
	if jerr := json.Unmarshal(out, &rep); jerr != nil || err != nil {
		c.t.Fatalf("%s: audit: %v\n%s", svc, errors.Join(err, jerr), out)
	}
	return rep
}

// network is the compose network a service's container is attached to.
func (c *composeFleet) network(svc string) string {
	c.t.Helper()
	out := c.docker("inspect", "-f", `{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}`, c.id(svc))
	nets := strings.Fields(out)
	if len(nets) != 1 {
		c.t.Fatalf("%s is on networks %v, want one", svc, nets)
	}
	return nets[0]
}

// failedContainers lists services whose containers exited with a non-zero code (a node
// exits non-zero on failure).
func (c *composeFleet) failedContainers() []string {
	var bad []string
	for svc, id := range c.containers() {
		out, err := exec.Command("docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", id).Output()
		if err != nil {
			continue
		}
		if f := strings.Fields(string(out)); len(f) == 2 && f[0] == "exited" && f[1] != "0" {
			bad = append(bad, svc+" (exit "+f[1]+")")
		}
	}
	slices.Sort(bad)
	return bad
}

func trainers(n int) []string {
	var out []string
	for i := 1; i <= n; i++ {
		out = append(out, fmt.Sprintf("trainer-%d", i))
	}
	return out
}

func accuracy(s *status.Status) float64 { return s.HeadMetrics["accuracy"] }
