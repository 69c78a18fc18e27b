package p2p

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"
	msmux "github.com/multiformats/go-multistream"
)

// A home router that reboots, or a NAT whose mapping expires, gives a volunteer's flows
// a new public address under connections both ends still hold. The volunteer notices (its
// next packet on the old connection is refused) and dials again; the other end does not:
// what it sends to the old address vanishes, and its swarm keeps opening streams on the
// old connection, which holds more streams than the new one (the swarm prefers that),
// until yamux's keepalive gives up on it. In the WAN lab a trainer behind a symmetric NAT
// whose router forgot its mappings reconnected within 4 s, and the validator went on
// sending heads and fetching its updates over the dead connection: not merged again in the
// 41 s the test waited (docs/wan.md, faults).
//
// So when a peer opens a connection while older ones to it are open, each older one is
// pinged over itself. A peer dials again only when it holds no connection to us (or both
// dialled at once, and then the older connection answers and stays). When one does not
// answer in time (see staleProbeRTTs), it is closed, and a second later every connection
// to the peer, the new one too (what the peer sent on the new one meanwhile is read in
// that second; see probe), and the peer (which keeps its validators and bootstrap peers
// connected) dials again: closing the stale one alone ends pubsub's stream on it, and
// pubsub then forgets the peer's subscriptions while keeping the peer, whose own stream
// (with the subscriptions, sent once) lives on the new connection, so it would never send
// the peer a head again (measured in the WAN lab: the trainer heard nothing for 1.5
// minutes after its stale connection was closed). On a connection made afresh every
// protocol starts over.

// StaleProbeTimeout is how long an older connection has at most to answer a ping once its
// peer has connected anew: a few retransmissions at a 250 ms round trip. yamux's own
// keepalive gives a ping 10 s (its write timeout), after 30 s of waiting.
const StaleProbeTimeout = 5 * time.Second

// A peer dials again when it holds no connection to us: an older connection it had then is
// gone at its end. So the older connection is pinged side by side with a ping over the new
// one, and once the new one has answered, the older one has staleProbeRTTs times as long,
// plus staleProbeSlack, to answer too (at least staleProbeFloor, at most
// StaleProbeTimeout): the two share the path, so a slow or loaded link gives both their
// time, while a trainer 250 ms away whose router forgot its mappings is not kept waiting
// the full timeout (every second of it delays its next merged update; docs/wan.md,
// faults). The exception is two connections opened at once (both peers dialled, the
// older one live): an older connection opened less than simultaneousDial before the new
// one gets the full StaleProbeTimeout.
const (
	staleProbeRTTs   = 3
	staleProbeSlack  = 500 * time.Millisecond
	staleProbeFloor  = time.Second
	simultaneousDial = 10 * time.Second
	// staleCloseGrace is how long the new connection lives on after the old one is
	// closed, before every connection to the peer is (see probe).
	staleCloseGrace = time.Second
)

// staleWatch probes the older connections of peers that connect anew (network.Notifiee).
type staleWatch struct {
	network.NoopNotifiee
	net     network.Network
	ctx     context.Context
	timeout time.Duration // StaleProbeTimeout
	floor   time.Duration // staleProbeFloor
	// together is simultaneousDial: an older connection opened less than this before the
	// new one gets the whole timeout.
	together time.Duration
	grace    time.Duration // staleCloseGrace
	log      *slog.Logger

	mu      sync.Mutex
	probing map[network.Conn]bool
}

// WatchStaleConns closes the connections of h that their peer has abandoned (see above)
// until ctx ends.
func WatchStaleConns(ctx context.Context, h host.Host, log *slog.Logger) {
	w := newStaleWatch(ctx, h, log)
	w.watch(h)
}

func newStaleWatch(ctx context.Context, h host.Host, log *slog.Logger) *staleWatch {
	return &staleWatch{net: h.Network(), ctx: ctx, timeout: StaleProbeTimeout, floor: staleProbeFloor, together: simultaneousDial,
		grace: staleCloseGrace, log: log, probing: map[network.Conn]bool{}}
}

func (w *staleWatch) watch(h host.Host) {
	h.Network().Notify(w)
	context.AfterFunc(w.ctx, func() { h.Network().StopNotify(w) })
}

// Connected is called for every new connection.
func (w *staleWatch) Connected(n network.Network, c network.Conn) {
	if w.ctx.Err() != nil {
		return
	}
	opened := c.Stat().Opened
	for _, old := range n.ConnsToPeer(c.RemotePeer()) {
		if old == c || old.IsClosed() || !old.Stat().Opened.Before(opened) || old.Stat().Limited {
			continue // not older, or relayed: a relay's limits end it anyway
		}
		w.mu.Lock()
		busy := w.probing[old]
		w.probing[old] = true
		w.mu.Unlock()
		if !busy {
			go w.probe(old, c)
		}
	}
}

// probe pings old, an older connection to the peer fresh was opened to, and closes every
// connection to the peer when old does not answer in time (see staleProbeRTTs).
func (w *staleWatch) probe(old, fresh network.Conn) {
	defer func() {
		w.mu.Lock()
		delete(w.probing, old)
		w.mu.Unlock()
	}()
	start := time.Now()
	ctx, cancel := context.WithTimeout(w.ctx, w.timeout)
	defer cancel()
	oldDone := make(chan error, 1)
	go func() { oldDone <- pingOver(ctx, old) }()
	var freshDone chan error // nil: old has the whole timeout
	if fresh.Stat().Opened.Sub(old.Stat().Opened) >= w.together {
		freshDone = make(chan error, 1)
		go func() { freshDone <- pingOver(ctx, fresh) }()
	}
	var err error
	var cut <-chan time.Time
	var rtt time.Duration // the new connection's answer
wait:
	for {
		select {
		case err = <-oldDone:
			break wait
		case ferr := <-freshDone:
			freshDone = nil
			if ferr == nil {
				rtt = time.Since(start)
				d := min(max(staleProbeRTTs*rtt+staleProbeSlack, w.floor), w.timeout)
				cut = time.After(time.Until(start.Add(d)))
			}
		case <-cut:
			err = fmt.Errorf("no answer in %v; the new connection answered in %v", time.Since(start).Round(time.Millisecond), rtt.Round(time.Millisecond))
			break wait
		}
	}
	if err == nil || w.ctx.Err() != nil || old.IsClosed() {
		return
	}
	w.log.Info("closed the connections of a peer that connected again: an older one no longer answers",
		"peer", old.RemotePeer().String(), "remote", old.RemoteMultiaddr().String(), "opened", old.Stat().Opened.Format(time.RFC3339), "err", err)
	_ = old.Close()
	// What the peer sent on the new connection meanwhile waits there: pubsub reads a
	// peer's new inbound stream only once it has reset the one on the old connection, and
	// that reset queues behind what the old connection could not send (an artifact being
	// served when the router forgot the mapping) until yamux's 10-s write timeout. Closed
	// at once with the old one, the new connection lost a trainer's contribution in the
	// WAN lab (docs/wan.md, faults). With the old one closed first, it is read and handed
	// on; then every connection is closed as above.
	select {
	case <-time.After(w.grace):
	case <-w.ctx.Done():
		return
	}
	_ = w.net.ClosePeer(old.RemotePeer())
}

// pingOver sends one libp2p ping over c itself (not over the peer's best connection, as
// the ping service does) and waits for its echo until ctx ends.
func pingOver(ctx context.Context, c network.Conn) error {
	s, err := c.NewStream(ctx)
	if err != nil {
		return fmt.Errorf("open a stream: %w", err)
	}
	defer s.Reset()
	if d, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(d)
	}
	if err := s.SetProtocol(ping.ID); err != nil {
		return err
	}
	if err := msmux.SelectProtoOrFail(ping.ID, s); err != nil {
		return fmt.Errorf("negotiate ping: %w", err)
	}
	out := make([]byte, ping.PingSize)
	_, _ = rand.Read(out)
	if _, err := s.Write(out); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	in := make([]byte, len(out))
	if _, err := io.ReadFull(s, in); err != nil {
		return fmt.Errorf("ping: no answer: %w", err)
	}
	if !bytes.Equal(in, out) {
		return fmt.Errorf("ping: wrong answer")
	}
	return nil
}
