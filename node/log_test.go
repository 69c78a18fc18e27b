package node

import (
	"bytes"
	"log/slog"
	"os"
	"sync"
	"testing"
)

// testLogger logs to stderr when P2P_TEST_LOG is set (info, or debug with
// P2P_TEST_LOG=debug). Otherwise the nodes of a test log at info into one buffer per test,
// the last testLogKeep bytes of which the test prints if it fails: a failure seen once in
// CI comes with what the nodes did.
func testLogger(t *testing.T, name string) *slog.Logger {
	lv := slog.LevelInfo
	switch os.Getenv("P2P_TEST_LOG") {
	case "":
		return slog.New(slog.NewTextHandler(failureLog(t), nil)).With("node", name)
	case "debug":
		lv = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv})).With("node", name)
}

// testLogKeep is how much of a test's node logs failureLog keeps (the newest lines).
const testLogKeep = 256 << 10

var failureLogs sync.Map // *testing.T → *tailBuffer

// failureLog is t's log buffer, printed when t fails.
func failureLog(t *testing.T) *tailBuffer {
	b, loaded := failureLogs.LoadOrStore(t, &tailBuffer{keep: testLogKeep})
	tb := b.(*tailBuffer)
	if !loaded {
		t.Cleanup(func() {
			failureLogs.Delete(t)
			if t.Failed() {
				t.Logf("the nodes' logs (info, the last %d KiB; P2P_TEST_LOG=debug for more):\n%s", testLogKeep>>10, tb.String())
			}
		})
	}
	return tb
}

// tailBuffer keeps the last keep bytes written to it, from a line's start.
type tailBuffer struct {
	mu   sync.Mutex
	b    []byte
	keep int
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if len(w.b) > 2*w.keep {
		cut := len(w.b) - w.keep
		if i := bytes.IndexByte(w.b[cut:], '\n'); i >= 0 {
			cut += i + 1
		}
		w.b = append(w.b[:0], w.b[cut:]...)
	}
	return len(p), nil
}

func (w *tailBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.b
	if len(b) > w.keep {
		b = b[len(b)-w.keep:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}
