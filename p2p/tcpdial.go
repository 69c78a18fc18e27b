package p2p

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	"github.com/libp2p/go-libp2p/p2p/transport/tcpreuse"
	"github.com/libp2p/go-netroute"
	"github.com/libp2p/go-reuseport"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// FreshPortFor is how long after a TCP connection this host dialled ends a new dial to the
// same address leaves the listen port alone and dials from a port the kernel picks.
//
// libp2p dials TCP from the port it listens on (SO_REUSEPORT), so that a router maps the
// connection as it maps the listener and the address peers observe is the one hole
// punching needs. A redial to the same address then has the old connection's addresses
// and ports, and a home router that has just seen the old connection end still holds its
// conntrack entry for that tuple: after a reset, in CLOSE for 10 s, and a SYN matching
// it is invalid there and dropped. Measured in the WAN lab (docs/wan.md, *Faults on the
// way*): a trainer whose router forgot its mappings (a reboot) had its old connection
// reset and redialled the validator from its listen port, and the SYNs got through only
// when the entry expired, 12–16 s later. A connection from another port is a new tuple
// and goes through at once. go-libp2p's TCP transport has no per-dial switch for this, so
// the node's host dials through tcpDialer (tcp.WithDialerForAddr), which dials as
// go-libp2p's own reuseport dialer does but for that case.
const FreshPortFor = 30 * time.Second

// tcpDialer is the TCP transport's dialer: from a port the host listens on, as go-libp2p's
// reuseport transport dials (p2p/net/reuseport: the listener whose address the system
// routes the destination from, else a loopback listener for a loopback destination, else a
// listener on the unspecified address, else a port the kernel picks; a dial whose port
// cannot be bound is retried from a fresh port), except to an address a connection dialled
// from this host to which ended in the last FreshPortFor.
type tcpDialer struct {
	mu     sync.Mutex
	host   host.Host
	ended  map[string]time.Time // "ip:port" dialled → when a connection to it ended
	now    func() time.Time
	reuse  bool
	endsN  int // connections seen to end (tests)
	freshN int // dials made from a fresh port because of ended (tests)
}

func newTCPDialer() *tcpDialer {
	return &tcpDialer{ended: map[string]time.Time{}, now: time.Now, reuse: tcpreuse.ReuseportIsAvailable()}
}

// option is the TCP transport's option that makes it dial through d.
func (d *tcpDialer) option() tcp.Option { return tcp.WithDialerForAddr(d.dialerFor) }

// attach gives d the host whose listeners it dials from, and watches its connections end.
// Dials before attach (none while libp2p.New runs) go from a port the kernel picks.
func (d *tcpDialer) attach(h host.Host) {
	d.mu.Lock()
	d.host = h
	d.mu.Unlock()
	h.Network().Notify(&network.NotifyBundle{DisconnectedF: d.disconnected})
}

func (d *tcpDialer) disconnected(_ network.Network, c network.Conn) {
	if c.Stat().Direction != network.DirOutbound || !isDirectTCP(c.RemoteMultiaddr()) {
		return
	}
	_, addr, err := manet.DialArgs(c.RemoteMultiaddr())
	if err != nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	for a, t := range d.ended { // a few entries at most: peers dialled in the last seconds
		if now.Sub(t) >= FreshPortFor {
			delete(d.ended, a)
		}
	}
	d.ended[addr] = now
	d.endsN++
}

// dialerFor is tcp.DialerForAddr.
func (d *tcpDialer) dialerFor(raddr ma.Multiaddr) (tcp.ContextDialer, error) {
	_, addr, err := manet.DialArgs(raddr)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	h := d.host
	t, ended := d.ended[addr]
	fresh := ended && d.now().Sub(t) < FreshPortFor
	if fresh {
		d.freshN++
	}
	d.mu.Unlock()
	if fresh || !d.reuse || h == nil {
		return &net.Dialer{}, nil
	}
	return reuseDialer{listen: h.Network().ListenAddresses()}, nil
}

// reuseDialer dials from one of the host's TCP listen ports (see tcpDialer).
type reuseDialer struct{ listen []ma.Multiaddr }

func (r reuseDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	raddr, err := net.ResolveTCPAddr(network, addr)
	if err != nil {
		return nil, err
	}
	laddr := r.source(raddr.IP)
	if laddr == nil {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	d := net.Dialer{LocalAddr: laddr, Control: reuseport.Control}
	c, err := d.DialContext(ctx, network, addr)
	if err == nil || !retryFromFreshPort(err) || ctx.Err() != nil {
		return c, err
	}
	// The port is taken for this destination (a connection on the same tuple), or the
	// address cannot be bound: as go-libp2p does, dial again from a port the kernel picks.
	var fresh net.Dialer
	return fresh.DialContext(ctx, network, addr)
}

// source is the listen address to dial dst from, or nil for a port the kernel picks.
func (r reuseDialer) source(dst net.IP) *net.TCPAddr {
	var specific, loopback, unspecified []*net.TCPAddr
	for _, a := range r.listen {
		if !isDirectTCP(a) {
			continue
		}
		na, err := manet.ToNetAddr(a)
		if err != nil {
			continue
		}
		t, ok := na.(*net.TCPAddr)
		if !ok || (t.IP.To4() == nil) != (dst.To4() == nil) {
			continue // another transport, or the other IP family
		}
		switch {
		case t.IP.IsLoopback():
			loopback = append(loopback, t)
		case t.IP.IsUnspecified():
			unspecified = append(unspecified, t)
		default:
			specific = append(specific, t)
		}
	}
	if len(specific) > 0 {
		if rt, err := netroute.New(); err == nil {
			if _, _, src, err := rt.Route(dst); err == nil {
				for _, a := range specific {
					if a.IP.Equal(src) {
						return a
					}
				}
			}
		}
	}
	if len(loopback) > 0 && dst.IsLoopback() {
		return loopback[rand.IntN(len(loopback))]
	}
	if len(unspecified) > 0 {
		return unspecified[rand.IntN(len(unspecified))]
	}
	return nil
}

// retryFromFreshPort: a dial from a listen port failed for a reason another port may not
// have (as go-libp2p's reuseErrShouldRetry): not a timeout, not a refusal.
func retryFromFreshPort(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return !errors.Is(err, syscall.ECONNREFUSED)
}
