package wan

import (
	"io"
	"math"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// memDev is a device in memory: what the forwarder reads comes from in, what it writes
// goes to out.
type memDev struct {
	in   chan []byte
	out  chan []byte
	once sync.Once
	done chan struct{}
}

func newMemDev() *memDev {
	return &memDev{in: make(chan []byte, 1<<16), out: make(chan []byte, 1<<16), done: make(chan struct{})}
}

func (d *memDev) Read(b []byte) (int, error) {
	select {
	case p := <-d.in:
		return copy(b, p), nil
	case <-d.done:
		return 0, io.EOF
	}
}

func (d *memDev) Write(b []byte) (int, error) {
	d.out <- append([]byte(nil), b...)
	return len(b), nil
}

func (d *memDev) Close() { d.once.Do(func() { close(d.done) }) }

// ipv4 is a minimal IPv4 packet of size bytes from src to dst with seq in its payload.
func ipv4(src, dst netip.Addr, size int, seq uint32) []byte {
	b := make([]byte, size)
	b[0] = 0x45
	s, d := src.As4(), dst.As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	b[20], b[21], b[22], b[23] = byte(seq>>24), byte(seq>>16), byte(seq>>8), byte(seq)
	return b
}

func seqOf(b []byte) uint32 {
	return uint32(b[20])<<24 | uint32(b[21])<<16 | uint32(b[22])<<8 | uint32(b[23])
}

type pair struct {
	f    *Forwarder
	a, b *memDev
	aIP  netip.Addr
	bIP  netip.Addr
}

func newPair(t *testing.T, a, b Link) *pair {
	p := &pair{f: NewForwarder(), a: newMemDev(), b: newMemDev(),
		aIP: netip.MustParseAddr("198.18.0.1"), bIP: netip.MustParseAddr("198.18.0.2")}
	p.f.Add("a", p.a, p.aIP, a.port(1))
	p.f.Add("b", p.b, p.bIP, b.port(2))
	t.Cleanup(func() { p.f.Close(); p.a.Close(); p.b.Close(); p.f.Wait() })
	return p
}

// A packet from a to b takes a's one-way delay plus b's, in order, with jitter inside its
// bounds.
func TestForwarderDelay(t *testing.T) {
	for _, c := range []struct {
		name   string
		a, b   Link
		lo, hi time.Duration
	}{
		{"fixed", Link{RTT: 60 * time.Millisecond}, Link{RTT: 40 * time.Millisecond}, 50 * time.Millisecond, 60 * time.Millisecond},
		{"jitter", Link{RTT: 60 * time.Millisecond, Jitter: 10 * time.Millisecond}, Link{RTT: 40 * time.Millisecond, Jitter: 10 * time.Millisecond}, 30 * time.Millisecond, 80 * time.Millisecond},
		{"none", Link{}, Link{}, 0, 10 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPair(t, c.a, c.b)
			const n = 200
			for i := range n {
				p.a.in <- ipv4(p.aIP, p.bIP, 100, uint32(i))
				time.Sleep(200 * time.Microsecond)
			}
			for i := range n {
				got := <-p.b.out
				if s := seqOf(got); s != uint32(i) {
					t.Fatalf("packet %d arrived as number %d: reordered", s, i)
				}
			}
			// Each packet's delay, measured alone: never below the bound (a late wake-up on a
			// loaded machine can only add), and the quickest of them within it.
			quickest := time.Hour
			for range 5 {
				start := time.Now()
				p.a.in <- ipv4(p.aIP, p.bIP, 100, 0)
				<-p.b.out
				d := time.Since(start)
				if d < c.lo {
					t.Fatalf("one-way %v, want at least %v", d, c.lo)
				}
				quickest = min(quickest, d)
			}
			if quickest > c.hi+5*time.Millisecond {
				t.Fatalf("quickest one-way of 5 %v, want at most %v", quickest, c.hi)
			}
		})
	}
}

// Loss drops about the configured share on each direction; the downlink rate spaces
// packets and drops what would wait longer than the queue limit.
func TestForwarderLossAndRate(t *testing.T) {
	p := newPair(t, Link{LossPct: 10}, Link{LossPct: 10})
	const n = 20000
	for i := range n {
		p.a.in <- ipv4(p.aIP, p.bIP, 60, uint32(i))
	}
	deadline := time.After(10 * time.Second)
	got := 0
	for got < n {
		select {
		case <-p.b.out:
			got++
			continue
		case <-deadline:
		case <-time.After(300 * time.Millisecond):
		}
		break
	}
	want := n * 0.9 * 0.9
	if math.Abs(float64(got)-want) > 4*math.Sqrt(n*0.19*0.81) {
		t.Fatalf("%d of %d packets through two 10 %% losses, want about %.0f", got, n, want)
	}
	if lost := p.f.Stats("a").Lost.Load() + p.f.Stats("b").Lost.Load(); int(lost)+got != n {
		t.Fatalf("lost %d + delivered %d != %d sent", lost, got, n)
	}

	// 8 Mbit/s downlink: 1000-byte packets leave 1 ms apart; a burst of 200 handed to the
	// downlink stage fills a 50 ms queue after about 50 of them and the rest are dropped.
	// The burst takes the time the loop takes; each millisecond of it lets one more through.
	r := newPair(t, Link{}, Link{DownMbit: 8, Queue: 50 * time.Millisecond})
	start := time.Now()
	for i := range 200 {
		b := ipv4(r.aIP, r.bIP, 1000, uint32(i))
		r.f.route(packet{buf: &b, n: len(b)})
	}
	burst := time.Since(start)
	got = 0
	var last time.Time
	for {
		select {
		case <-r.b.out:
			got++
			last = time.Now()
			continue
		case <-time.After(300 * time.Millisecond):
		}
		break
	}
	if hi := 52 + int(burst/time.Millisecond); got < 50 || got > hi {
		t.Fatalf("%d of a burst of 200 (in %v) through an 8 Mbit/s downlink with a 50 ms queue, want 50 to %d", got, burst, hi)
	}
	if d := last.Sub(start); d < time.Duration(got-2)*time.Millisecond {
		t.Fatalf("%d packets of 1000 bytes in %v: faster than 8 Mbit/s", got, d)
	}
	if drops := r.f.Stats("b").QueueDrops.Load(); int(drops)+got != 200 {
		t.Fatalf("queue drops %d + delivered %d != 200", drops, got)
	}
}

// Packets to an address no port has are dropped and counted.
func TestForwarderUnroutable(t *testing.T) {
	p := newPair(t, Link{}, Link{})
	p.a.in <- ipv4(p.aIP, netip.MustParseAddr("198.18.0.99"), 60, 0)
	for range 100 {
		if p.f.Stats("a").Unroutable.Load() == 1 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("a packet to an unknown address was not counted unroutable")
}

// The forwarder's own cost per packet, without devices: the in-memory path of 1500-byte
// packets from one port to another (b.N packets), reported as Mbit/s.
func BenchmarkForwarderMem(b *testing.B) {
	f := NewForwarder()
	a, c := newMemDev(), newMemDev()
	aIP, cIP := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	f.Add("a", a, aIP, PortConfig{Up: Direction{Delay: time.Millisecond}, Seed: 1})
	f.Add("c", c, cIP, PortConfig{Down: Direction{Delay: time.Millisecond}, Seed: 2})
	defer func() { f.Close(); a.Close(); c.Close(); f.Wait() }()
	pkt := ipv4(aIP, cIP, mtu, 0)
	b.SetBytes(mtu)
	b.ResetTimer()
	start := time.Now()
	window := make(chan struct{}, 1024) // packets in flight, below every queue's capacity
	go func() {
		for range b.N {
			window <- struct{}{}
			a.in <- pkt
		}
	}()
	for range b.N {
		<-c.out
		<-window
	}
	b.ReportMetric(float64(b.N)*mtu*8/time.Since(start).Seconds()/1e6, "Mbit/s")
}
