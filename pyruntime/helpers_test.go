package pyruntime

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/internal/testenv"
)

// The tests run Python from P2P_PYTHON, or Debian's /usr/bin/python3 (which has torch;
// the python3 first on PATH may not).
func testInterpreter() string {
	if p := os.Getenv("P2P_PYTHON"); p != "" {
		return p
	}
	return "/usr/bin/python3"
}

var (
	probeMu    sync.Mutex
	probeCache = map[string]error{}
)

func requireModules(t testing.TB, modules string) {
	t.Helper()
	probeMu.Lock()
	err, ok := probeCache[modules]
	if !ok {
		out, e := exec.Command(testInterpreter(), "-c", "import "+modules).CombinedOutput()
		if e != nil {
			err = &skipReason{msg: strings.TrimSpace(string(out)) + " (" + e.Error() + ")"}
		}
		probeCache[modules] = err
	}
	probeMu.Unlock()
	if err != nil {
		testenv.Missing(t, "%s cannot import %s: %v; set P2P_PYTHON to an interpreter with torch (Debian: apt-get install python3-torch python3-numpy python3-sklearn)", testInterpreter(), modules, err)
	}
}

type skipReason struct{ msg string }

func (s *skipReason) Error() string { return s.msg }

func requireTorch(t testing.TB)   { requireModules(t, "torch, numpy") }
func requireSklearn(t testing.TB) { requireModules(t, "torch, numpy, sklearn") }
func requireNumpy(t testing.TB)   { requireModules(t, "numpy") }

// logBuffer collects log output safely across goroutines (worker output may arrive after
// a test returned, when t.Log would panic); it is printed when the test fails.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func testLogger(t testing.TB) (*slog.Logger, *logBuffer) {
	lb := &logBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", lb.String())
		}
	})
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

func baseOptions(t testing.TB, factory string, config map[string]any) (Options, *logBuffer) {
	log, lb := testLogger(t)
	return Options{
		Interpreter: testInterpreter(), Factory: factory, Config: config, Threads: 1, Device: "cpu",
		Logger: log, CallTimeout: 60 * time.Second, TrainTimeout: 2 * time.Minute,
	}, lb
}

func startWorker(t testing.TB, opts Options) (*Worker, Info) {
	t.Helper()
	w, err := NewWorker(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	info, err := w.Start(ctx)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	return w, info
}

var (
	digitsOnce   sync.Once
	digitsDir    string
	digitsShards []string
	digitsErr    error
)

// digitsDataset prepares the digits shards once per test binary.
func digitsDataset(t testing.TB) []string {
	t.Helper()
	requireSklearn(t)
	digitsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pyruntime-digits-*")
		if err != nil {
			digitsErr = err
			return
		}
		digitsDir = dir
		opts, _ := baseOptions(t, "p2ptrain.workloads.digits:Digits", nil)
		opts.Logger = slog.New(slog.DiscardHandler)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if digitsErr = PrepareDataset(ctx, opts, dir); digitsErr != nil {
			return
		}
		digitsShards, digitsErr = filepath.Glob(filepath.Join(dir, "shard-*.npz"))
		sort.Strings(digitsShards)
	})
	if digitsErr != nil {
		t.Fatalf("prepare digits: %v", digitsErr)
	}
	return digitsShards
}

func TestMain(m *testing.M) {
	if base := os.Getenv(scratchHelperEnv); base != "" {
		scratchHelper(base) // a child process of a scratch test; never returns
	}
	code := m.Run()
	if digitsDir != "" {
		os.RemoveAll(digitsDir)
	}
	os.Exit(code)
}
