package node

import (
	"log/slog"
	"os"
	"testing"
)

// testLogger logs to stderr when P2P_TEST_LOG is set (info, or debug with
// P2P_TEST_LOG=debug), and nowhere otherwise.
func testLogger(t *testing.T, name string) *slog.Logger {
	lv := slog.LevelInfo
	switch os.Getenv("P2P_TEST_LOG") {
	case "":
		return slog.New(slog.DiscardHandler)
	case "debug":
		lv = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv})).With("node", name)
}
