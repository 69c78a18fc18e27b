package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/node"
	"github.com/p2pnode/p2pnode/status"
)

// Binary builds p2pnode for the tests once per test binary and returns its path;
// $P2PNODE_E2E_BINARY names a prebuilt one instead (a machine without Go). It is the attack
// build (-tags attack, `make build TAGS=attack`): the tests' attackers run `p2pnode run
// --poison MODE`, and a node given no --poison runs exactly as the default build's.
var Binary = sync.OnceValues(func() (string, error) {
	if b := os.Getenv("P2PNODE_E2E_BINARY"); b != "" {
		return filepath.Abs(b)
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(file))
	out := filepath.Join(os.TempDir(), fmt.Sprintf("p2pnode-e2e-%d", os.Getpid()))
	cmd := exec.Command("go", "build", "-tags", "attack", "-o", out, "./cmd/p2pnode")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build p2pnode: %v\n%s", err, b)
	}
	return out, nil
})

// RepoRoot is the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// Proc is one p2pnode process run by a test: its config, output and lifecycle.
type Proc struct {
	t      testing.TB
	Name   string
	Dir    string
	Config string
	Cfg    *config.Config
	// Args are appended to `p2pnode run --config FILE` (e.g. --poison MODE).
	Args []string
	// Command, when set, replaces `run --config FILE` (e.g. `join --dir DIR ADDR`, whose
	// config is written by the command itself at Config).
	Command []string
	// Wrap, when set, is the command that runs p2pnode, which is appended to it (e.g.
	// `ip netns exec NS` to run the node in a network namespace).
	Wrap []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	out  strings.Builder // progress lines (stdout)
	logs strings.Builder // stderr
	// roundAt is when each progress line was read (stdout lines that are rounds).
	roundAt []time.Time
	done    chan struct{}
	exit    error
}

// NewProc writes cfg to dir/name.yaml; relative paths in cfg are relative to dir.
func NewProc(t testing.TB, dir, name string, cfg *config.Config) *Proc {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	loaded, err := config.Load(path)
	if err != nil {
		t.Fatalf("config for %s: %v", name, err)
	}
	return &Proc{t: t, Name: name, Dir: dir, Config: path, Cfg: loaded}
}

// maxLine is the longest output line a Proc keeps; longer ones are cut.
const maxLine = 64 << 10

// Start runs `p2pnode run --config` in the background.
func (p *Proc) Start() {
	p.t.Helper()
	bin, err := Binary()
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	command := []string{"run", "--config", p.Config}
	if len(p.Command) > 0 {
		command = p.Command
	}
	argv := append(append(append(slices.Clone(p.Wrap), bin), command...), append([]string{"--log-format", "text"}, p.Args...)...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = p.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start %s: %v", p.Name, err)
	}
	p.cmd, p.done, p.exit = cmd, make(chan struct{}), nil
	var wg sync.WaitGroup
	wg.Add(2)
	// collect drains r to the end whatever its lines' lengths: a reader that stopped at an
	// overlong line would leave the pipe full and the node blocked on its next write.
	collect := func(r io.Reader, into *strings.Builder) {
		defer wg.Done()
		br := bufio.NewReaderSize(r, 64<<10)
		for {
			line, err := br.ReadString('\n')
			if line != "" {
				line = strings.TrimSuffix(line, "\n")
				if len(line) > maxLine {
					line = line[:maxLine] + fmt.Sprintf(" … (%d bytes more)", len(line)-maxLine)
				}
				p.mu.Lock()
				into.WriteString(line + "\n")
				if into == &p.out && roundLine.MatchString(line) {
					p.roundAt = append(p.roundAt, time.Now())
				}
				p.mu.Unlock()
			}
			if err != nil {
				return
			}
		}
	}
	go collect(stdout, &p.out)
	go collect(stderr, &p.logs)
	done := p.done
	go func() {
		wg.Wait()
		err := cmd.Wait()
		p.mu.Lock()
		p.exit = err
		p.mu.Unlock()
		close(done)
	}()
	p.t.Cleanup(func() { p.Kill() })
}

// Kill sends SIGKILL to the process group (the node and its Python worker) and waits.
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Wait waits for the process to exit on its own and returns its error.
func (p *Proc) Wait(timeout time.Duration) error {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	select {
	case <-done:
	case <-time.After(timeout):
		return fmt.Errorf("%s did not exit within %s", p.Name, timeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

// PID is the process id of the running node (0 before Start).
func (p *Proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Output is what the process printed on stdout so far (progress lines).
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// Logs is what the process printed on stderr so far.
func (p *Proc) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

var roundLine = regexp.MustCompile(`(?m)^round\s+(\d+)(?:/\d+)?\s+(.*)$`)

// Rounds returns the round numbers of the progress lines printed so far.
func (p *Proc) Rounds() []int {
	var out []int
	for _, m := range roundLine.FindAllStringSubmatch(p.Output(), -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, n)
	}
	return out
}

// RoundTimes returns when each progress line of Rounds was read.
func (p *Proc) RoundTimes() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.roundAt)
}

// LastAccuracy returns the held-out accuracy of the last progress line that has one.
func (p *Proc) LastAccuracy() (float64, bool) {
	re := regexp.MustCompile(`held-out accuracy\s+([\d.]+)%`)
	ms := re.FindAllStringSubmatch(p.Output(), -1)
	if len(ms) == 0 {
		return 0, false
	}
	v, _ := strconv.ParseFloat(ms[len(ms)-1][1], 64)
	return v / 100, true
}

// AccuracyAt returns the held-out accuracy printed for round r.
func (p *Proc) AccuracyAt(r int) (float64, bool) {
	re := regexp.MustCompile(fmt.Sprintf(`(?m)^round\s+%d(?:/\d+)?\s.*held-out accuracy\s+([\d.]+)%%`, r))
	m := re.FindStringSubmatch(p.Output())
	if m == nil {
		return 0, false
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v / 100, true
}

// MetricAt returns the held-out metric name (loss, bits_per_byte, ...) printed for round r.
func (p *Proc) MetricAt(r int, name string) (float64, bool) {
	re := regexp.MustCompile(fmt.Sprintf(`(?m)^round\s+%d(?:/\d+)?\s.*held-out %s\s+([\d.]+)`, r, regexp.QuoteMeta(name)))
	m := re.FindStringSubmatch(p.Output())
	if m == nil {
		return 0, false
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v, true
}

// Status reads the node's /status through the address it records in its store.
func (p *Proc) Status(ctx context.Context) (*status.Status, error) {
	b, err := os.ReadFile(filepath.Join(p.Cfg.Node.StoreDir, status.HTTPAddrFile))
	if err != nil {
		return nil, err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+strings.TrimSpace(string(b))+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var s status.Status
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return nil, err
	}
	return &s, nil
}

// HeadChain reads the head chain (genesis first) from the node's store, up to its tip.
func (p *Proc) HeadChain(t testing.TB) []*chain.Head {
	t.Helper()
	stores, err := node.OpenStores(p.Cfg)
	if err != nil {
		t.Fatal(err)
	}
	tip, err := stores.ResolveHead("latest")
	if err != nil {
		t.Fatal(err)
	}
	_, heads, err := stores.Heads.Chain(tip)
	if err != nil {
		t.Fatal(err)
	}
	return heads
}

// Metrics reads the node's /metrics.
func (p *Proc) Metrics(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.Cfg.Node.StoreDir, status.HTTPAddrFile))
	if err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
	resp, err := http.Get("http://" + strings.TrimSpace(string(b)) + "/metrics")
	if err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// peerID is the node's peer id, from the first line it prints.
func (p *Proc) peerID(t testing.TB) string {
	t.Helper()
	m := regexp.MustCompile(`^p2pnode (\S+):`).FindStringSubmatch(p.Output())
	if m == nil {
		t.Fatalf("%s printed no peer id", p.Name)
	}
	return m[1]
}

// Eventually polls cond every interval until it returns true or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// DumpOnFailure writes the processes' output into the test log when the test failed.
func DumpOnFailure(t testing.TB, procs ...*Proc) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, p := range procs {
			t.Logf("==== %s stdout ====\n%s", p.Name, p.Output())
			logs := p.Logs()
			if len(logs) > 20000 {
				logs = logs[len(logs)-20000:]
			}
			t.Logf("==== %s stderr (tail) ====\n%s", p.Name, logs)
		}
	})
}
