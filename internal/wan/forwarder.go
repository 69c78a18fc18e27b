package wan

import (
	"errors"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Direction is what one direction of a node's link does to a packet beyond its rate: a
// one-way delay, a jitter (each packet's delay is drawn uniformly from Delay ± Jitter, and
// never leaves before the packet sent ahead of it: no reordering), and a random loss.
type Direction struct {
	Delay, Jitter time.Duration
	Loss          float64 // probability in [0, 1)
}

// DefaultQueue is how long a packet may wait for a link's rate before it is dropped (the
// drop-tail queue of a home router or of the provider's side), unless a spec says otherwise.
const DefaultQueue = 100 * time.Millisecond

// queueCap bounds the packets in flight on one direction of one link (a 500 Mbit/s link
// at 300 ms holds about 12 500 full-size packets).
const queueCap = 1 << 15

// mtu is the TUN devices' MTU; the forwarder's buffers hold one packet of it.
const mtu = 1500

type packet struct {
	buf *[]byte
	n   int
	due time.Time
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, mtu+64); return &b }}

// port is one node's link as the forwarder sees it: the device its packets come from and go
// to, the address they carry, and what each direction does.
type port struct {
	name     string
	dev      io.ReadWriter
	addr     netip.Addr
	up, down Direction
	downBits float64 // downlink rate in bit/s, 0 for unlimited
	queue    time.Duration

	upQ, downQ chan packet

	mu        sync.Mutex // guards what follows: the up stage's and down stage's schedules
	rng       *rand.Rand
	lastUp    time.Time
	busyUntil time.Time
	lastDown  time.Time

	stats PortStats
}

// PortStats counts one port's packets.
type PortStats struct {
	In, Out        atomic.Uint64 // read from and written to its device
	Lost           atomic.Uint64 // dropped by the random loss of either direction
	QueueDrops     atomic.Uint64 // dropped by a full downlink queue
	Unroutable     atomic.Uint64 // sent to an address no port has
	WriteErrs      atomic.Uint64
	BytesIn, Bytes atomic.Uint64
}

// Forwarder carries IPv4 packets between devices (in the lab, TUN devices), each packet
// through its sender's uplink direction and then its receiver's downlink direction and rate.
// Uplink rates are left to the kernel (tbf on the sending device), so a sender feels its
// link's backpressure as at home.
type Forwarder struct {
	mu     sync.RWMutex
	ports  map[netip.Addr]*port
	byName map[string]*port
	stop   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool
}

// NewForwarder returns a forwarder with no ports.
func NewForwarder() *Forwarder {
	return &Forwarder{ports: map[netip.Addr]*port{}, byName: map[string]*port{}, stop: make(chan struct{})}
}

// PortConfig is what a port's link does.
type PortConfig struct {
	Up, Down Direction     // to the packets the node sends, and to those it receives
	DownMbit float64       // the downlink's rate, 0 for unlimited
	Queue    time.Duration // the downlink's drop-tail queue, DefaultQueue if 0
	Seed     uint64        // makes the jitter and loss draws reproducible
}

// Add starts carrying the packets of dev, a device whose node has address addr.
func (f *Forwarder) Add(name string, dev io.ReadWriter, addr netip.Addr, c PortConfig) {
	if c.Queue <= 0 {
		c.Queue = DefaultQueue
	}
	p := &port{name: name, dev: dev, addr: addr, up: c.Up, down: c.Down, downBits: c.DownMbit * 1e6, queue: c.Queue,
		upQ: make(chan packet, queueCap), downQ: make(chan packet, queueCap),
		rng: rand.New(rand.NewPCG(c.Seed, uint64(len(name))))}
	f.mu.Lock()
	f.ports[addr] = p
	f.byName[name] = p
	f.mu.Unlock()
	f.wg.Add(3)
	go f.read(p)
	go f.release(p.upQ, f.route)
	go f.release(p.downQ, p.write)
}

// Stats returns the counters of the port named name, or nil.
func (f *Forwarder) Stats(name string) *PortStats {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if p := f.byName[name]; p != nil {
		return &p.stats
	}
	return nil
}

// Close stops the forwarder; the caller closes the devices (which ends their readers) before
// or after.
func (f *Forwarder) Close() {
	if f.closed.CompareAndSwap(false, true) {
		close(f.stop)
	}
}

// Wait returns once every goroutine of the forwarder has ended (after Close and the devices'
// closing).
func (f *Forwarder) Wait() { f.wg.Wait() }

// delay draws one packet's delay for d, from rng.
func (d Direction) delay(rng *rand.Rand) time.Duration {
	if d.Jitter <= 0 {
		return d.Delay
	}
	return max(0, d.Delay-d.Jitter+time.Duration(rng.Int64N(int64(2*d.Jitter)+1)))
}

// read takes p's packets off its device and schedules them through p's uplink direction.
func (f *Forwarder) read(p *port) {
	defer f.wg.Done()
	for {
		b := bufPool.Get().(*[]byte)
		n, err := p.dev.Read(*b)
		if err != nil {
			bufPool.Put(b)
			if errors.Is(err, io.EOF) || f.closed.Load() || isClosed(err) {
				return
			}
			select {
			case <-f.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		p.stats.In.Add(1)
		p.stats.BytesIn.Add(uint64(n))
		now := time.Now()
		p.mu.Lock()
		lost := p.up.Loss > 0 && p.rng.Float64() < p.up.Loss
		var due time.Time
		if !lost {
			due = now.Add(p.up.delay(p.rng))
			if due.Before(p.lastUp) {
				due = p.lastUp
			}
			p.lastUp = due
		}
		p.mu.Unlock()
		if lost {
			p.stats.Lost.Add(1)
			bufPool.Put(b)
			continue
		}
		select {
		case p.upQ <- packet{buf: b, n: n, due: due}:
		default:
			p.stats.QueueDrops.Add(1)
			bufPool.Put(b)
		}
	}
}

func isClosed(err error) bool {
	return errors.Is(err, os.ErrClosed) || errors.Is(err, io.ErrClosedPipe)
}

// release hands each packet of q to next at its due time, in order.
func (f *Forwarder) release(q chan packet, next func(packet)) {
	defer f.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var pk packet
		select {
		case pk = <-q:
		case <-f.stop:
			return
		}
		if wait := time.Until(pk.due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-f.stop:
				bufPool.Put(pk.buf)
				return
			}
		}
		next(pk)
	}
}

// route takes a packet that has crossed its sender's uplink into its receiver's downlink:
// the random loss, the rate (a packet that would wait longer than the port's queue is
// dropped, as a full router queue drops it), then the delay.
func (f *Forwarder) route(pk packet) {
	b := (*pk.buf)[:pk.n]
	var dst netip.Addr
	if len(b) >= 20 && b[0]>>4 == 4 {
		dst = netip.AddrFrom4([4]byte(b[16:20]))
	}
	f.mu.RLock()
	p := f.ports[dst]
	f.mu.RUnlock()
	if p == nil {
		if src := f.source(b); src != nil {
			src.stats.Unroutable.Add(1)
		}
		bufPool.Put(pk.buf)
		return
	}
	now := time.Now()
	p.mu.Lock()
	drop := p.down.Loss > 0 && p.rng.Float64() < p.down.Loss
	full := false
	if !drop {
		start := now
		if p.busyUntil.After(start) {
			start = p.busyUntil
		}
		if p.downBits > 0 {
			if start.Sub(now) > p.queue {
				full = true
			} else {
				p.busyUntil = start.Add(time.Duration(float64(pk.n*8) / p.downBits * 1e9))
				start = p.busyUntil
			}
		}
		if !full {
			pk.due = start.Add(p.down.delay(p.rng))
			if pk.due.Before(p.lastDown) {
				pk.due = p.lastDown
			}
			p.lastDown = pk.due
		}
	}
	p.mu.Unlock()
	switch {
	case drop:
		p.stats.Lost.Add(1)
	case full:
		p.stats.QueueDrops.Add(1)
	default:
		select {
		case p.downQ <- pk:
			return
		default:
			p.stats.QueueDrops.Add(1)
		}
	}
	bufPool.Put(pk.buf)
}

// source returns the port whose address is b's source, or nil.
func (f *Forwarder) source(b []byte) *port {
	if len(b) < 20 {
		return nil
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.ports[netip.AddrFrom4([4]byte(b[12:16]))]
}

// write delivers a packet to p's device.
func (p *port) write(pk packet) {
	if _, err := p.dev.Write((*pk.buf)[:pk.n]); err != nil {
		p.stats.WriteErrs.Add(1)
	} else {
		p.stats.Out.Add(1)
		p.stats.Bytes.Add(uint64(pk.n))
	}
	bufPool.Put(pk.buf)
}
