package gossip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"
)

type recordHandler struct {
	mu   sync.Mutex
	msgs []string
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

func TestRejectLogIsRateLimited(t *testing.T) {
	h := &recordHandler{}
	r := newRejectLog(slog.New(h))
	now := time.Unix(1000, 0)
	bad := reject(reasonMalformed, errors.New("x"))
	p := peer.ID("peer-a")

	for range 100 { // a flood from one peer: one line
		r.reject(now, KindHeads, p, p, bad)
	}
	require.Len(t, h.msgs, 1)
	r.reject(now, KindHeads, p, p, reject(reasonBadSignature, errors.New("y")))
	require.Len(t, h.msgs, 2, "another reason is another line")

	for i := range 1000 { // a flood of fresh peer ids: the per-minute budget holds
		r.reject(now, KindHeads, peer.ID(fmt.Sprint("sybil-", i)), p, bad)
	}
	require.Len(t, h.msgs, r.budget)

	r.reject(now.Add(time.Minute), KindHeads, peer.ID("peer-b"), p, bad)
	require.Equal(t, "gossip rejections not logged (rate limit)", h.msgs[r.budget])
	require.Equal(t, "rejected gossip message", h.msgs[r.budget+1])

	r.reject(now.Add(r.quiet+time.Minute), KindHeads, p, p, bad)
	require.Len(t, h.msgs, r.budget+3, "the first peer is told again after the quiet period")
	require.LessOrEqual(t, len(r.last), maxRejectKeys)
	// Logs are rate-limited; the counts shown in /status are not.
	require.Equal(t, map[string]uint64{"heads/malformed": 100 + 1000 + 2, "heads/bad_signature": 1}, r.rejections())
}
