package artifact

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
)

const (
	benchFetchSize = 256 << 20
	benchWrite     = 1 << 20
	rawProtocol    = "/p2ptrain/bench/raw/1.0.0"

	// BenchmarkSwarmFetch: every link is capped, so one holder's link is the
	// bottleneck and more holders should add up.
	swarmSize      = 64 << 20
	swarmBandwidth = 32 << 20 // bytes per second per link (mocknet shares it between directions)
)

// fastRandom fills n bytes quickly (ChaCha8), so creating sources stays cheap.
func fastRandom(seed uint64, n int) []byte {
	var s [32]byte
	s[0] = byte(seed)
	b := make([]byte, n)
	rand.NewChaCha8(s).Read(b)
	return b
}

// tcpHosts starts two connected hosts (see newTCPHost).
func tcpHosts(tb testing.TB) (fetcher, holder host.Host) {
	fetcher, holder = newTCPHost(tb), newTCPHost(tb)
	connectTCP(tb, fetcher, holder)
	return fetcher, holder
}

// newTCPHost starts a host with the default transports, listening on loopback TCP
// only, secured with Noise (the default would prefer TLS) and muxed by yamux.
func newTCPHost(tb testing.TB) host.Host {
	h, err := libp2p.New(
		libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"),
		libp2p.Security(noise.ID, noise.New),
	)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.Close() })
	return h
}

func connectTCP(tb testing.TB, a, b host.Host) {
	if err := a.Connect(context.Background(), peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkArtifactFetch compares fetching a 256 MiB artifact with the protocol
// (verified, written to the store, fsynced) against copying the same bytes over one raw
// stream between the same two hosts into a sink. The floor-* sub-benchmarks are not
// targets: they measure the two costs the protocol must add to raw-stream (hashing
// every chunk, writing it to disk) on the machine at hand. cpu-ns/B is the process's
// CPU time per byte, which other load on a shared machine disturbs less than MB/s.
func BenchmarkArtifactFetch(b *testing.B) {
	fetcher, holder := tcpHosts(b)
	data := fastRandom(1, benchFetchSize)
	serveRaw := func(s network.Stream) {
		for off := 0; off < len(data); off += benchWrite {
			if _, err := s.Write(data[off : off+benchWrite]); err != nil {
				s.Reset()
				return
			}
		}
		s.Close()
	}
	holder.SetStreamHandler(rawProtocol, serveRaw)
	defer holder.RemoveStreamHandler(rawProtocol)
	rawFetch := func(b *testing.B, read func(io.Reader) int64) {
		var cpu cpuMeter
		b.SetBytes(benchFetchSize)
		b.ResetTimer()
		for range b.N {
			cpu.begin()
			s, err := fetcher.NewStream(context.Background(), holder.ID(), rawProtocol)
			if err != nil {
				b.Fatal(err)
			}
			if n := read(s); n != benchFetchSize {
				b.Fatalf("copied %d bytes", n)
			}
			s.Close()
			cpu.end()
		}
		cpu.report(b, benchFetchSize)
	}

	b.Run("raw-stream", func(b *testing.B) {
		sink := make([]byte, benchWrite)
		rawFetch(b, func(r io.Reader) int64 {
			n, _ := io.CopyBuffer(io.Discard, onlyReader{r}, sink)
			return n
		})
	})

	// The raw copy plus the SHA-256 that every received chunk needs, hashed off the
	// reading goroutine as the protocol does: the gap to raw-stream is verification.
	b.Run("floor-sha256", func(b *testing.B) { rawFetch(b, readAndHash) })

	// The store's side alone: chunks take the fetch's path (aligned buffers, O_DIRECT
	// pwrite at their offsets, fsync, install) with no network and no hashing.
	b.Run("floor-disk", func(b *testing.B) {
		m, err := ManifestOf(bytes.NewReader(data), DefaultChunkSize)
		if err != nil {
			b.Fatal(err)
		}
		id, mb := m.ID(), m.Encode()
		buf := buffers.get(DefaultChunkSize)
		defer buffers.put(buf)
		var cpu cpuMeter
		b.SetBytes(benchFetchSize)
		b.ResetTimer()
		for range b.N {
			b.StopTimer()
			dst, err := OpenStore(b.TempDir(), Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			cpu.begin()
			p, _, err := dst.openPartial(id, mb, m)
			if err != nil {
				b.Fatal(err)
			}
			for i := range m.Chunks {
				begin, end := m.ChunkRange(i)
				chunk := (*buf)[:end-begin]
				copy(chunk, data[begin:end])
				if err := p.writeChunk(i, chunk); err != nil {
					b.Fatal(err)
				}
			}
			if err := p.finish(); err != nil {
				b.Fatal(err)
			}
			cpu.end()
			b.StopTimer()
			os.RemoveAll(dst.Dir())
			b.StartTimer()
		}
		cpu.report(b, benchFetchSize)
	})

	b.Run("protocol", func(b *testing.B) {
		src, err := OpenStore(b.TempDir(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		id, err := src.PutBytes(data)
		if err != nil {
			b.Fatal(err)
		}
		hx := NewExchange(holder, src, ExchangeOptions{})
		defer hx.Close()
		var cpu cpuMeter
		b.SetBytes(benchFetchSize)
		b.ResetTimer()
		for range b.N {
			b.StopTimer()
			dir, err := os.MkdirTemp(b.TempDir(), "fetch")
			if err != nil {
				b.Fatal(err)
			}
			dst, err := OpenStore(dir, Options{})
			if err != nil {
				b.Fatal(err)
			}
			fx := NewExchange(fetcher, dst, ExchangeOptions{})
			b.StartTimer()
			cpu.begin()
			if err := fx.Fetch(context.Background(), id, holder.ID()); err != nil {
				b.Fatal(err)
			}
			cpu.end()
			b.StopTimer()
			fx.Close()
			os.RemoveAll(dir)
			b.StartTimer()
		}
		cpu.report(b, benchFetchSize)
	})
}

// BenchmarkSwarmFetch fetches one artifact over bandwidth-capped mocknet links from one
// holder and from four: the four-holder fetch should take about a quarter of the time.
func BenchmarkSwarmFetch(b *testing.B) {
	for _, holders := range []int{1, 4} {
		b.Run(fmt.Sprintf("holders-%d", holders), func(b *testing.B) {
			mn := mocknet.New()
			defer mn.Close()
			mn.SetLinkDefaults(mocknet.LinkOptions{Bandwidth: swarmBandwidth})
			for range holders + 1 {
				if _, err := mn.GenPeer(); err != nil {
					b.Fatal(err)
				}
			}
			if err := mn.LinkAll(); err != nil {
				b.Fatal(err)
			}
			if err := mn.ConnectAllButSelf(); err != nil {
				b.Fatal(err)
			}
			hosts := mn.Hosts()
			fetcher, holderHosts := hosts[0], hosts[1:]

			// The holders serve from one store: only reads happen there.
			src, err := OpenStore(b.TempDir(), Options{})
			if err != nil {
				b.Fatal(err)
			}
			id, err := src.PutBytes(fastRandom(2, swarmSize))
			if err != nil {
				b.Fatal(err)
			}
			var hints []peer.ID
			for _, h := range holderHosts {
				x := NewExchange(h, src, ExchangeOptions{})
				defer x.Close()
				hints = append(hints, h.ID())
			}
			b.SetBytes(swarmSize)
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				fx, dir := swarmFetcher(b, fetcher)
				resetLinks(mn, fetcher, holderHosts)
				b.StartTimer()
				if err := fx.Fetch(context.Background(), id, hints...); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				fx.Close()
				os.RemoveAll(dir)
				b.StartTimer()
			}
		})
	}
}

func swarmFetcher(b *testing.B, h host.Host) (*Exchange, string) {
	dir, err := os.MkdirTemp(b.TempDir(), "fetch")
	if err != nil {
		b.Fatal(err)
	}
	dst, err := OpenStore(dir, Options{})
	if err != nil {
		b.Fatal(err)
	}
	return NewExchange(h, dst, ExchangeOptions{}), dir
}

// resetLinks re-applies the link options, which empties mocknet's token buckets: an
// idle link otherwise banks a full second of bandwidth and sends it as a burst.
func resetLinks(mn mocknet.Mocknet, fetcher host.Host, holders []host.Host) {
	for _, h := range holders {
		for _, l := range mn.LinksBetweenPeers(fetcher.ID(), h.ID()) {
			l.SetOptions(mocknet.LinkOptions{Bandwidth: swarmBandwidth})
		}
	}
}

// readAndHash reads 1 MiB pieces and hashes them on GOMAXPROCS goroutines.
func readAndHash(r io.Reader) int64 {
	workers := runtime.GOMAXPROCS(0)
	full := make(chan *[]byte, workers)
	free := make(chan *[]byte, 2*workers)
	for range 2 * workers {
		b := make([]byte, benchWrite)
		free <- &b
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range full {
				sha256.Sum256(*b)
				free <- b
			}
		}()
	}
	var total int64
	for {
		b := <-free
		n, err := io.ReadFull(r, *b)
		total += int64(n)
		if err != nil {
			break
		}
		full <- b
	}
	close(full)
	wg.Wait()
	return total
}

// cpuMeter reports the process's CPU time (user+system) per byte moved, a view of
// efficiency that other load on a shared machine disturbs less than MB/s.
type cpuMeter struct {
	start time.Duration
	spent time.Duration
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (c *cpuMeter) begin() { c.start = processCPU() }
func (c *cpuMeter) end()   { c.spent += processCPU() - c.start }
func (c *cpuMeter) report(b *testing.B, bytesPerOp int) {
	b.ReportMetric(float64(c.spent.Nanoseconds())/float64(b.N)/float64(bytesPerOp), "cpu-ns/B")
}
