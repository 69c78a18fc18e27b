package e2e

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInterruptIsQuiet: Ctrl-C (SIGINT to the node's process group, as a terminal sends it)
// stops a training node with exit status 130, one "stopping…" line and no warning or error
// on the way out; then `p2pnode status` says the node is not running and names its last
// head, instead of "connection refused".
func TestInterruptIsQuiet(t *testing.T) {
	cfg := digitsConfig(t, t.TempDir(), 0)
	requirePython(t, cfg.Workload.Interpreter)
	p := NewProc(t, t.TempDir(), "solo", cfg)
	DumpOnFailure(t, p)
	p.Start()
	Eventually(t, 3*time.Minute, "round 3", func() bool {
		r := p.Rounds()
		return len(r) > 0 && r[len(r)-1] >= 3
	})
	p.mu.Lock()
	pid := p.cmd.Process.Pid
	p.mu.Unlock()
	before := len(p.Logs())
	if err := syscall.Kill(-pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := p.Wait(time.Minute)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 130 {
		t.Fatalf("after Ctrl-C the node exited with %v, want status 130", err)
	}
	after := p.Logs()[before:]
	stopping := 0
	for _, l := range strings.Split(after, "\n") {
		if strings.HasPrefix(l, "p2pnode: stopping…") {
			stopping++
			continue
		}
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") || strings.HasPrefix(l, "p2pnode:") {
			t.Errorf("shutting down logged: %s", l)
		}
	}
	if stopping != 1 {
		t.Errorf("Ctrl-C printed %d \"p2pnode: stopping…\" lines, want one:\n%s", stopping, after)
	}

	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "status", "--config", p.Config).CombinedOutput()
	if err == nil {
		t.Fatalf("status of a stopped node succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "is not running (it stopped") || !strings.Contains(string(out), "its last head is") {
		t.Fatalf("status of a stopped node says:\n%s", out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}
