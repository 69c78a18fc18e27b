// Package memprobe measures the peak memory of work run by a test: the parent runs one test
// of its own binary in a child process (Child), which does the work and reports its peak
// RSS (ReportPeak). The child reports its own peak because the rusage a parent gets counts
// the pages the child shared with it before exec, and the parent holds the inputs it made.
package memprobe

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

const marker = "peak-rss-kib "

// ReportPeak prints this process's peak RSS (VmHWM of /proc/self/status) for Child to read.
func ReportPeak(t testing.TB) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatalf("peak RSS: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			os.Stdout.WriteString("\n" + marker + strings.TrimSuffix(strings.TrimSpace(v), " kB") + "\n")
			return
		}
	}
	t.Fatal("peak RSS: no VmHWM in /proc/self/status")
}

// Child runs the test named test of this test binary in a child process with env added to
// the environment, and returns the peak RSS (MiB) it reported and its wall time.
func Child(t testing.TB, test string, env ...string) (mib float64, wall time.Duration) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	wall = time.Since(start)
	if err != nil {
		t.Fatalf("child %s: %v: %s", test, err, out)
	}
	_, after, ok := strings.Cut(string(out), marker)
	if !ok {
		t.Fatalf("child %s did not report its peak RSS: %s", test, out)
	}
	kib, err := strconv.Atoi(strings.Fields(after)[0])
	if err != nil {
		t.Fatalf("child %s: peak RSS %q: %v", test, after, err)
	}
	return float64(kib) / 1024, wall
}
