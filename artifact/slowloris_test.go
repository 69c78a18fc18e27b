package artifact

import (
	"bufio"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A peer that starts request frames and stalls loses each stream within the frame
// deadline (plus a second), while an honest fetch from the same holder goes on.
func TestSlowlorisStreamsAreDropped(t *testing.T) {
	const deadline = 2 * time.Second
	// Real TCP hosts: mocknet streams ignore deadlines.
	ah, hh, fh := newTCPHost(t), newTCPHost(t), newTCPHost(t)
	connectTCP(t, ah, hh)
	connectTCP(t, fh, hh)
	attacker := newTestNode(t, ah, t.TempDir(), ExchangeOptions{})
	holder := newTestNode(t, hh, t.TempDir(), ExchangeOptions{FrameDeadline: deadline})
	honest := newTestNode(t, fh, t.TempDir(), ExchangeOptions{})
	data := randomBytes(41, 8<<20)
	id := seed(t, data, holder)
	small := seed(t, randomBytes(42, 3*testChunk), holder)

	whole := appendRequest(nil, request{kind: reqChunks, id: small, indices: []int{0, 1}})
	half := appendRequest(nil, request{kind: reqManifest, id: small})
	half = half[:len(half)/2+1]
	garbage := func(seed uint64) []byte {
		b := make([]byte, 4<<10)
		r := rand.New(rand.NewPCG(seed, seed))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	attacks := []struct {
		name string
		send []byte
	}{
		{"half a frame", half},
		{"half a length prefix", []byte{0x80}},
		{"length only", appendUvarint(nil, 200)},
		{"a whole request, then half of the next", append(append([]byte{}, whole...), half...)},
	}
	for seed := range uint64(8) {
		attacks = append(attacks, struct {
			name string
			send []byte
		}{"4 KiB of garbage", garbage(seed)})
	}

	type result struct {
		name string
		held time.Duration
		err  error
	}
	results := make(chan result, len(attacks))
	var wg sync.WaitGroup
	for _, a := range attacks {
		wg.Go(func() {
			ctx := fetchCtx(t, deadline+10*time.Second)
			start := time.Now()
			s, err := attacker.h.NewStream(ctx, holder.id(), ProtocolID)
			if err != nil {
				results <- result{name: a.name, err: err}
				return
			}
			defer s.Reset()
			if _, err := s.Write(a.send); err != nil {
				results <- result{name: a.name, err: err}
				return
			}
			// Read whatever the holder answers until it ends the stream; give up well past
			// the bound so that a holder that never does fails the test, not hangs it.
			s.SetReadDeadline(start.Add(deadline + 5*time.Second))
			_, _ = io.Copy(io.Discard, s)
			results <- result{name: a.name, held: time.Since(start)}
		})
	}

	fetchStart := time.Now()
	require.NoError(t, honest.x.Fetch(fetchCtx(t, 30*time.Second), id, holder.id()))
	fetchTook := time.Since(fetchStart)
	requireStored(t, honest, id, data)

	wg.Wait()
	close(results)
	var longest time.Duration
	for r := range results {
		require.NoError(t, r.err, r.name)
		require.LessOrEqual(t, r.held, deadline+time.Second, "%s: stream held %v, frame deadline %v", r.name, r.held, deadline)
		longest = max(longest, r.held)
	}
	t.Logf("%d stalled streams, longest held %v (frame deadline %v); honest 8 MiB fetch took %v meanwhile",
		len(attacks), longest.Round(time.Millisecond), deadline, fetchTook.Round(time.Millisecond))
}

// Idle time between complete requests is not bounded by the frame deadline: a fetcher
// that waits longer than it before its next request is still served.
func TestIdleBetweenRequestsOutlastsFrameDeadline(t *testing.T) {
	const deadline = 300 * time.Millisecond
	ch, hh := tcpHosts(t)
	client := newTestNode(t, ch, t.TempDir(), ExchangeOptions{})
	holder := newTestNode(t, hh, t.TempDir(), ExchangeOptions{FrameDeadline: deadline})
	id := seed(t, randomBytes(43, 2*testChunk), holder)
	s, err := client.h.NewStream(fetchCtx(t, 10*time.Second), holder.id(), ProtocolID)
	require.NoError(t, err)
	defer s.Reset()
	br := bufio.NewReader(s)
	for i := range 2 {
		if i > 0 {
			time.Sleep(3 * deadline)
		}
		_, err := s.Write(appendRequest(nil, request{kind: reqManifest, id: id}))
		require.NoError(t, err)
		resp, err := readResponse(br, MaxManifestBytes+1)
		require.NoError(t, err, "request %d", i)
		require.Equal(t, respManifest, resp.kind, "request %d", i)
		_, err = br.Discard(resp.dataLen)
		require.NoError(t, err)
	}
}
