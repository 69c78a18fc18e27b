package artifact

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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
// stream between the same two hosts into a sink. Each iteration runs, back to back:
//
//	raw-stream          the raw copy, the baseline
//	raw+blake3          the raw copy, every 1 MiB hashed on GOMAXPROCS goroutines
//	raw-to-disk         the raw copy written by one O_DIRECT writer at its offsets, fsynced
//	raw+blake3-to-disk  both: what any fetch that verifies and stores the bytes must at
//	                    least do, with no protocol at all (the floor)
//	protocol            Exchange.Fetch into an empty store
//
// and the ratios (baseline time / time) are taken per iteration, so that both sides of
// a ratio see the same machine: on a shared 2-core VM the raw stream's own speed drifts
// by a third from one minute to the next. The floors are not targets; they show what
// hashing and writing cost on the machine at hand, and protocol-vs-floor is the
// protocol's own overhead. cpu-ns/B is the process's CPU time per byte.
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
		s, err := fetcher.NewStream(context.Background(), holder.ID(), rawProtocol)
		if err != nil {
			b.Fatal(err)
		}
		if n := read(s); n != benchFetchSize {
			b.Fatalf("copied %d bytes", n)
		}
		s.Close()
	}
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

	type way struct {
		name string
		run  func(b *testing.B, dir string)
	}
	sink := make([]byte, benchWrite)
	// pipeline is a raw fetch read by readPipeline, hashing and/or writing to disk.
	pipeline := func(hash, disk bool) func(*testing.B, string) {
		return func(b *testing.B, dir string) {
			path := ""
			if disk {
				path = filepath.Join(dir, "raw")
			}
			rawFetch(b, func(r io.Reader) int64 { return readPipeline(b, r, hash, path) })
		}
	}
	ways := []way{
		{"raw-stream", func(b *testing.B, _ string) {
			rawFetch(b, func(r io.Reader) int64 {
				n, _ := io.CopyBuffer(io.Discard, onlyReader{r}, sink)
				return n
			})
		}},
		{"raw+blake3", pipeline(true, false)},
		{"raw-to-disk", pipeline(false, true)},
		{"raw+blake3-to-disk", pipeline(true, true)},
		{"protocol", func(b *testing.B, dir string) {
			dst, err := OpenStore(dir, Options{})
			if err != nil {
				b.Fatal(err)
			}
			fx := NewExchange(fetcher, dst, ExchangeOptions{})
			defer fx.Close()
			if err := fx.Fetch(context.Background(), id, holder.ID()); err != nil {
				b.Fatal(err)
			}
		}},
	}
	took := make([][]float64, len(ways)) // seconds, per iteration
	cpu := make([]cpuMeter, len(ways))
	b.ResetTimer()
	for range b.N {
		for i, w := range ways {
			b.StopTimer()
			dir, err := os.MkdirTemp(b.TempDir(), w.name)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			start := time.Now()
			cpu[i].begin()
			w.run(b, dir)
			cpu[i].end()
			took[i] = append(took[i], time.Since(start).Seconds())
			b.StopTimer()
			os.RemoveAll(dir)
			b.StartTimer()
		}
	}
	b.StopTimer()
	// vs reports the median over iterations of took[base]/took[i]: how fast way i ran
	// next to the base measured beside it.
	vs := func(i, base int) float64 {
		ratios := make([]float64, len(took[i]))
		for k := range took[i] {
			ratios[k] = took[base][k] / took[i][k]
		}
		return median(ratios)
	}
	for i, w := range ways {
		b.ReportMetric(float64(benchFetchSize)/1e6/median(took[i]), w.name+"-MB/s")
		b.ReportMetric(cpu[i].perByte(b.N, benchFetchSize), w.name+"-cpu-ns/B")
		if i > 0 {
			b.ReportMetric(vs(i, 0), w.name+"-vs-raw")
		}
	}
	named := func(name string) int {
		return slices.IndexFunc(ways, func(w way) bool { return w.name == name })
	}
	b.ReportMetric(vs(named("protocol"), named("raw+blake3-to-disk")), "protocol-vs-floor")
	// CPU per byte, the bound for the protocol (time on loopback is bound by the
	// machine's cores; CPU spent per byte is what a trainer gives up to move an artifact).
	floorCPU := cpu[named("raw+blake3-to-disk")].perByte(b.N, benchFetchSize)
	b.ReportMetric(cpu[named("protocol")].perByte(b.N, benchFetchSize)/floorCPU, "protocol-cpu-vs-floor")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return (s[len(s)/2] + s[(len(s)-1)/2]) / 2
}

// readPipeline reads r in 1 MiB aligned buffers, as the protocol receives chunks. With
// hash set every buffer is hashed as chunks are, on GOMAXPROCS goroutines; with a path
// one O_DIRECT writer puts every buffer at its offset in a new file, fsynced at the end.
// It returns the number of bytes read.
func readPipeline(b *testing.B, r io.Reader, hash bool, path string) int64 {
	type piece struct {
		buf *[]byte
		off int64
	}
	var out io.WriterAt
	var file *os.File
	if path != "" {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(benchFetchSize); err != nil {
			b.Fatal(err)
		}
		file, out = f, f
		if direct := openDirect(path); direct != nil {
			defer direct.Close()
			out = direct
		}
	}
	workers := 0
	if hash {
		workers = runtime.GOMAXPROCS(0)
	}
	free := make(chan *[]byte, writeQueue+2+workers)
	for range cap(free) {
		free <- buffers.get(benchWrite)
	}
	read := make(chan piece, cap(free))   // to the hashers
	hashed := make(chan piece, cap(free)) // to the writer
	var hashers sync.WaitGroup
	for range workers {
		hashers.Add(1)
		go func() {
			defer hashers.Done()
			for p := range read {
				chunkSum(*p.buf)
				hashed <- p
			}
		}()
	}
	var werr error
	written := make(chan struct{})
	go func() {
		defer close(written)
		for p := range hashed {
			if out != nil {
				if _, err := out.WriteAt(*p.buf, p.off); err != nil && werr == nil {
					werr = err
				}
			}
			free <- p.buf
		}
	}()
	next := hashed
	if hash {
		next = read
	}
	var total int64
	for {
		buf := <-free
		n, err := io.ReadFull(r, *buf)
		total += int64(n)
		if err != nil { // the benchmark's sizes are whole MiB: the last read gets none
			free <- buf
			break
		}
		next <- piece{buf, total - int64(n)}
	}
	close(read)
	hashers.Wait()
	close(hashed)
	<-written
	for range cap(free) {
		buffers.put(<-free)
	}
	if werr != nil {
		b.Fatal(werr)
	}
	if file != nil {
		if err := file.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	return total
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
func (c *cpuMeter) perByte(ops, bytesPerOp int) float64 {
	return float64(c.spent.Nanoseconds()) / float64(ops) / float64(bytesPerOp)
}
