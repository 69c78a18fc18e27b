//go:build wan

package e2e

// WAN tests: nodes in network namespaces on rate-limited links (internal/wan). They need
// root, ip and tc, and take minutes, so they sit behind the wan build tag:
//
//	make wan          the swarm on home uplinks, a table per trainer and round
//	make wan-goodput  a 40 MB artifact over a 20 Mbit/s uplink: raw TCP (1 and 4 flows),
//	                  the artifact protocol over TCP and over QUIC
//	make wan-goodput-grid  wan-goodput at RTT 20/100/250 ms × loss 0/0.5/2 %
//	make wan-holepunch  DCUtR between two homes through a relay (holepunch_test.go)
//
// Settings come from the environment: WAN_CODEC (sparse), WAN_ROUNDS (4), WAN_TRAINERS (3),
// WAN_UP_MBIT (20), WAN_DOWN_MBIT (100), WAN_WORKLOAD (digits; lm or charlm train what
// `p2pnode demo --workload` does), WAN_PRESET (the lm preset; small is 10.8 M parameters),
// WAN_BATCH (the workload's batch_size), WAN_HIDDEN (the digits MLP's width; 512 makes it
// 300 K parameters, 4096 17 M), WAN_INNER_STEPS (protocol.inner_steps; the swarm's default
// otherwise), WAN_OVERLAP (protocol.overlap: eager to train ahead), WAN_SIZE_MB (40),
// WAN_REPS (2), WAN_RTT_MS and WAN_LOSS_PCT (the goodput holder's distance and loss),
// WAN_FRAMES=1 (goodput also with yamux's default 64 KiB frames), WAN_QUIC=0 (goodput:
// not over QUIC alone), WAN_CHECK=0 (goodput: print the table, check nothing),
// WAN_YAMUX_INIT_WINDOW (goodput: yamux's initial stream window in bytes, 256 KiB otherwise),
// WAN_STREAMS (goodput: the fetcher's streams to the holder, fixed; otherwise as the node
// opens them, more the farther the holder is, artifact/streams.go),
// WAN_SPEC (a lab spec file, relative to the repository root or absolute, e.g. configs/wan/home.yaml: its nodes, the
// validator then trainer-1, …, replace WAN_TRAINERS, WAN_UP_MBIT and WAN_DOWN_MBIT).

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	lpswarm "github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2pquic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	"golang.org/x/sync/errgroup"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/demo"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/internal/wan"
	"github.com/p2pnode/p2pnode/node"
	"github.com/p2pnode/p2pnode/p2p"
)

func envFloat(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil && v > 0 {
		return v
	}
	return def
}

// ---- helper processes: the test binary run again inside a namespace ----

const helperEnv = "P2PWAN_HELPER"

// TestWANHelper is not a test: the goodput test runs the test binary in a namespace with
// P2PWAN_HELPER=holder or fetcher, the hole punching test with hp-relay, hp-warmer,
// hp-listener or hp-dialer, and this is what it does there.
func TestWANHelper(t *testing.T) {
	switch os.Getenv(helperEnv) {
	case "":
		t.Skip("helper process of the WAN tests")
	case "holder":
		wanHolder(t)
	case "fetcher":
		wanFetcher(t)
	case "hp-relay":
		hpRelay(t)
	case "hp-listener":
		hpListener(t)
	case "hp-dialer":
		hpDialer(t)
	case "hp-warmer":
		hpWarmer(t)
	}
}

func helperHost(t *testing.T, listen []string, maxMessage uint32) host.Host {
	// The node's transports and dialling (p2p.NewHost): TCP with Noise and yamux, and
	// QUIC; TCP first where a peer has both.
	opts := []libp2p.Option{
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.Transport(libp2pquic.NewTransport),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Muxer(yamux.ID, labYamux(maxMessage)),
		libp2p.SwarmOpts(lpswarm.WithDialRanker(p2p.TCPFirst)),
	}
	if len(listen) > 0 {
		opts = append(opts, libp2p.ListenAddrStrings(listen...))
	} else {
		opts = append(opts, libp2p.NoListenAddrs)
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func goodputData(size int) []byte {
	b := make([]byte, size)
	rand.NewChaCha8([32]byte{'w', 'a', 'n'}).Read(b)
	return b
}

// wanHolder stores the artifact, serves it with the artifact protocol on :4001 (TCP) and
// :4003 (QUIC) and as raw TCP streams on :4002 (the baselines: a connection that sends
// "i n\n" gets the i-th of n equal parts, one flow of several), prints READY <TCP addr>
// <artifact id> <QUIC addr> and serves until stdin closes.
func wanHolder(t *testing.T) {
	size := envInt("WAN_SIZE_MB", 40) * 1_000_000
	maxMsg, _ := strconv.Atoi(os.Getenv("P2PWAN_MAXMSG"))
	addr := os.Getenv("P2PWAN_ADDR")
	data := goodputData(size)
	store, err := artifact.OpenStore(t.TempDir(), artifact.Options{})
	if err != nil {
		t.Fatal(err)
	}
	id, err := store.PutBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	h := helperHost(t, []string{"/ip4/" + addr + "/tcp/4001", "/ip4/" + addr + "/udp/4003/quic-v1"}, uint32(maxMsg))
	defer h.Close()
	x := artifact.NewExchange(h, store, artifact.ExchangeOptions{})
	defer x.Close()
	ln, err := net.Listen("tcp", addr+":4002")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var i, n int
				if _, err := fmt.Fscanf(c, "%d %d\n", &i, &n); err != nil || n < 1 || i < 0 || i >= n {
					return
				}
				c.Write(data[i*len(data)/n : (i+1)*len(data)/n])
			}()
		}
	}()
	fmt.Printf("READY /ip4/%s/tcp/4001/p2p/%s %s /ip4/%s/udp/4003/quic-v1/p2p/%s\n", addr, h.ID(), id, addr, h.ID())
	io.Copy(io.Discard, os.Stdin)
}

// wanFetcher fetches the holder's artifact (or, with P2PWAN_RAW, reads its raw stream in
// P2PWAN_FLOWS parallel TCP flows, flow i from the i-th of P2PWAN_RAW's comma-separated
// holders, round robin) and prints FETCHED <bytes> <seconds> <transport>. The holders'
// addresses are P2PWAN_HOLDER, comma-separated: with several of one holder, the host's
// dial ranker picks; with several holders, the download uses them all.
func wanFetcher(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if raw := os.Getenv("P2PWAN_RAW"); raw != "" {
		flows := envInt("P2PWAN_FLOWS", 1)
		holders := strings.Split(raw, ",")
		conns := make([]net.Conn, flows)
		for i := range conns {
			c, err := net.Dial("tcp", holders[i%len(holders)])
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			conns[i] = c
		}
		start := time.Now()
		var total atomic.Int64
		var g errgroup.Group
		for i, c := range conns {
			g.Go(func() error {
				if _, err := fmt.Fprintf(c, "%d %d\n", i, flows); err != nil {
					return err
				}
				n, err := io.Copy(io.Discard, c)
				total.Add(n)
				return err
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("FETCHED %d %.6f tcp\n", total.Load(), time.Since(start).Seconds())
		return
	}
	maxMsg, _ := strconv.Atoi(os.Getenv("P2PWAN_MAXMSG"))
	var addrs []ma.Multiaddr
	for _, a := range strings.Split(os.Getenv("P2PWAN_HOLDER"), ",") {
		addrs = append(addrs, ma.StringCast(a))
	}
	infos, err := peer.AddrInfosFromP2pAddrs(addrs...)
	if err != nil || len(infos) == 0 {
		t.Fatalf("P2PWAN_HOLDER %q: %v", os.Getenv("P2PWAN_HOLDER"), err)
	}
	id, err := cids.Parse(os.Getenv("P2PWAN_ARTIFACT"))
	if err != nil {
		t.Fatal(err)
	}
	h := helperHost(t, nil, uint32(maxMsg))
	defer h.Close()
	var holders []peer.ID
	for _, ai := range infos {
		if err := h.Connect(ctx, ai); err != nil {
			t.Fatal(err)
		}
		holders = append(holders, ai.ID)
	}
	store, err := artifact.OpenStore(t.TempDir(), artifact.Options{})
	if err != nil {
		t.Fatal(err)
	}
	streams := envInt("WAN_STREAMS", 0)
	x := artifact.NewExchange(h, store, artifact.ExchangeOptions{StreamsPerPeer: streams, MaxStreamsPerPeer: streams})
	defer x.Close()
	start := time.Now()
	if err := x.Fetch(ctx, id, holders...); err != nil {
		t.Fatal(err)
	}
	secs := time.Since(start).Seconds()
	m, err := store.Manifest(id)
	if err != nil {
		t.Fatal(err)
	}
	transport := "?"
	if cs := h.Network().ConnsToPeer(holders[0]); len(cs) > 0 {
		transport = "tcp"
		if _, err := cs[0].RemoteMultiaddr().ValueForProtocol(ma.P_QUIC_V1); err == nil {
			transport = "quic"
		}
	}
	fmt.Printf("FETCHED %d %.6f %s\n", m.Size, secs, transport)
}

// helper runs the test binary in n's namespace as role; it returns the process and a
// reader of its stdout.
func helper(t *testing.T, n *wan.Node, role string, env ...string) (*exec.Cmd, *bufio.Scanner, io.WriteCloser) {
	t.Helper()
	cmd := n.Command(os.Args[0], "-test.run=^TestWANHelper$", "-test.v=false")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+role, "P2PWAN_ADDR="+n.Addr), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, bufio.NewScanner(stdout), stdin
}

// expectLine reads lines until one starts with prefix and returns its fields.
func expectLine(t *testing.T, sc *bufio.Scanner, prefix string) []string {
	t.Helper()
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 && f[0] == prefix {
			return f[1:]
		}
	}
	t.Fatalf("helper ended without a %s line", prefix)
	return nil
}

// TestWANGoodput: a 40 MB artifact over the holder's 20 Mbit/s uplink. Per repetition it
// measures a raw TCP stream of the same bytes (the same-run baseline: what the shaped link
// gives any TCP flow) and four raw flows of a quarter each, then the artifact protocol over
// TCP (Noise, yamux with the node's 65 519-byte frames), over QUIC, given both addresses
// as the node dials, and (WAN_FRAMES=1) over TCP with yamux's default 64 KiB frames.
// Reports goodput as a share of the link rate and of the one raw stream, the bytes on the
// holder's wire per payload byte, and the transport used. The protocol as the node dials
// (given both addresses, TCP first: p2p.TCPFirst) must reach 0.9 of the one raw stream;
// with WAN_CHECK=0 it only prints. WAN_HOLDERS=2 adds a second holder on a link like the
// first's, one raw flow from each, and the protocol fetching from both as the node does.
func TestWANGoodput(t *testing.T) {
	up := envFloat("WAN_UP_MBIT", 20)
	reps := envInt("WAN_REPS", 2)
	// WAN_RTT_MS and WAN_LOSS_PCT put the holder at a distance, on a lossy link.
	rtt := time.Duration(envFloat("WAN_RTT_MS", 0) * float64(time.Millisecond))
	loss, _ := strconv.ParseFloat(os.Getenv("WAN_LOSS_PCT"), 64)
	// WAN_HOLDERS=2 adds a second holder of the same bytes on a link like the first's:
	// the ways that fetch from both (a round's heads and updates usually have several
	// holders) against one raw flow from one holder and one from each.
	nHolders := envInt("WAN_HOLDERS", 1)
	if nHolders > 2 {
		t.Fatalf("WAN_HOLDERS=%d: 1 or 2", nHolders)
	}
	link := wan.Link{UpMbit: up, DownMbit: envFloat("WAN_DOWN_MBIT", 100), RTT: rtt, LossPct: loss}
	specs := []wan.Spec{{Name: "holder", Link: link}, {Name: "fetcher"}}
	if nHolders == 2 {
		specs = append(specs, wan.Spec{Name: "holder-2", Link: link})
	}
	lab := newLab(t, wan.LabSpec{Seed: 46, Nodes: specs})
	fetcher := lab.Nodes[1]
	holderNodes := []*wan.Node{lab.Nodes[0]}
	if nHolders == 2 {
		holderNodes = append(holderNodes, lab.Nodes[2])
	}
	type result struct {
		goodput, wire []float64
		transport     string
	}
	type way struct {
		name    string
		maxMsg  uint32
		raw     int    // raw TCP flows (0: the artifact protocol)
		dial    string // the holder's addresses the fetcher gets: tcp, quic or both
		holders int    // how many holders serve it (1 unless WAN_HOLDERS=2)
	}
	const frames = p2p.YamuxMaxMessageSize
	ways := []way{{"raw TCP stream (baseline)", 0, 1, "tcp", 1}, {"raw TCP, 4 flows", 0, 4, "tcp", 1},
		{"protocol, TCP", frames, 0, "tcp", 1}, {"protocol, QUIC", frames, 0, "quic", 1},
		{"protocol, as the node dials (both)", frames, 0, "both", 1}}
	if envInt("WAN_FRAMES", 0) == 1 {
		ways = append(ways, way{"protocol, TCP, yamux frames 65536", 65536, 0, "tcp", 1})
	}
	if nHolders == 2 {
		ways = append(ways, way{"raw TCP, 1 flow from each of 2 holders", 0, 2, "tcp", 2},
			way{"protocol, 2 holders, as the node dials", frames, 0, "both", 2})
	}
	if os.Getenv("WAN_QUIC") == "0" {
		// QUIC alone on a lossy, distant link takes many minutes for 40 MB (Cubic).
		ways = slices.DeleteFunc(ways, func(w way) bool { return w.dial == "quic" })
	}
	results := make([]result, len(ways))
	sent := func(nodes []*wan.Node) uint64 {
		var n uint64
		for _, h := range nodes {
			c, err := h.Counters()
			if err != nil {
				t.Fatal(err)
			}
			n += c.TxBytes
		}
		return n
	}
	for range reps {
		for i, w := range ways {
			var at, raw []string
			var id string
			var stdins []io.WriteCloser
			for _, hn := range holderNodes[:w.holders] {
				_, hsc, hin := helper(t, hn, "holder", fmt.Sprintf("P2PWAN_MAXMSG=%d", w.maxMsg))
				ready := expectLine(t, hsc, "READY")
				at = append(at, map[string]string{"tcp": ready[0], "quic": ready[2], "both": ready[0] + "," + ready[2]}[w.dial])
				raw = append(raw, hn.Addr+":4002")
				stdins = append(stdins, hin)
				if id == "" {
					id = ready[1]
				} else if ready[1] != id {
					t.Fatalf("the holders' artifacts differ: %s and %s", id, ready[1])
				}
			}
			before := sent(holderNodes[:w.holders])
			env := []string{fmt.Sprintf("P2PWAN_MAXMSG=%d", w.maxMsg), "P2PWAN_HOLDER=" + strings.Join(at, ","), "P2PWAN_ARTIFACT=" + id}
			if w.raw > 0 {
				env = append(env, "P2PWAN_RAW="+strings.Join(raw, ","), fmt.Sprintf("P2PWAN_FLOWS=%d", w.raw))
			}
			fcmd, fsc, _ := helper(t, fetcher, "fetcher", env...)
			got := expectLine(t, fsc, "FETCHED")
			fcmd.Wait()
			after := sent(holderNodes[:w.holders])
			for _, hin := range stdins {
				hin.Close()
			}
			bytes, _ := strconv.ParseFloat(got[0], 64)
			secs, _ := strconv.ParseFloat(got[1], 64)
			results[i].goodput = append(results[i].goodput, bytes*8/secs/1e6)
			results[i].wire = append(results[i].wire, float64(after-before)/bytes)
			results[i].transport = got[2]
		}
	}
	med := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return (s[len(s)/2] + s[(len(s)-1)/2]) / 2
	}
	raw := med(results[0].goodput)
	fmt.Printf("\n%d MB over a %.0f Mbit/s uplink (tbf), RTT %v, loss %g %%, median of %d\n", envInt("WAN_SIZE_MB", 40), up, rtt, loss, reps)
	fmt.Printf("%-42s %10s %10s %10s %12s %10s\n", "way", "Mbit/s", "% of link", "vs raw", "wire B/B", "over")
	var node float64
	for i, w := range ways {
		g := med(results[i].goodput)
		fmt.Printf("%-42s %10.2f %9.1f%% %10.3f %12.4f %10s\n", w.name, g, 100*g/up, g/raw, med(results[i].wire), results[i].transport)
		if w.dial == "both" && w.holders == 1 {
			node = g
		}
	}
	// What the node gets (its dialling picks the transport) must be nearly what the link
	// gives one TCP flow. The issue asks for at least one flow's rate on a lossy link; where
	// that flow fills the link (BBR) the two differ by noise, so the check is 0.9 there too
	// and the table says how close it came.
	if os.Getenv("WAN_CHECK") != "0" && node < 0.9*raw {
		t.Fatalf("the node's goodput %.2f Mbit/s (over %s) is below 0.9 × the raw stream's %.2f Mbit/s on the same link",
			node, results[slices.IndexFunc(ways, func(w way) bool { return w.dial == "both" && w.holders == 1 })].transport, raw)
	}
}

// ---- the swarm on home uplinks ----

var (
	trainedLine = regexp.MustCompile(`msg=trained .*round=(\d+) .*train_seconds=([\d.]+)`)
	headLine    = regexp.MustCompile(`(?m)^round\s+(\d+)/`)
)

// TestWANSwarm runs the digits swarm with each node in its own namespace: the validator
// unshaped (a datacentre node), each trainer on a home link (20 Mbit/s up, 100 down). It
// prints, per trainer and round, the bytes on the trainer's wire (interface counters), its
// training seconds and the round's wall time, the compute utilization (training seconds
// / wall seconds) over the run, and whether the round's head merged its contribution (a
// trainer left out of any round fails the test).
func TestWANSwarm(t *testing.T) {
	trainers := envInt("WAN_TRAINERS", 3)
	rounds := envInt("WAN_ROUNDS", 4)
	codec := os.Getenv("WAN_CODEC")
	if codec == "" {
		codec = "sparse"
	}
	specs := []wan.Spec{{Name: "validator"}}
	for i := 1; i <= trainers; i++ {
		specs = append(specs, wan.Spec{Name: fmt.Sprintf("trainer-%d", i),
			Link: wan.Link{UpMbit: envFloat("WAN_UP_MBIT", 20), DownMbit: envFloat("WAN_DOWN_MBIT", 100)}})
	}
	spec := wan.LabSpec{Nodes: specs}
	if path := os.Getenv("WAN_SPEC"); path != "" {
		spec, trainers = swarmSpec(t, path)
	}
	lab := newLab(t, spec)
	dir := t.TempDir()
	workload := os.Getenv("WAN_WORKLOAD")
	if workload != "" && workload != demo.WorkloadDigits && envInt("WAN_HIDDEN", 0) > 0 {
		t.Fatalf("WAN_HIDDEN is the digits MLP's width; WAN_WORKLOAD=%s has no such key (WAN_PRESET and WAN_BATCH size it)", workload)
	}
	o := demo.Options{Dir: dir, Trainers: trainers, Rounds: rounds, Workload: workload, Preset: os.Getenv("WAN_PRESET")}
	procs := labSwarm(t, lab, o, func(name string, c *config.Config) {
		c.Protocol.Codec = diloco.Codec(codec)
		if hidden := envInt("WAN_HIDDEN", 0); hidden > 0 {
			c.Workload.Config["hidden"] = hidden
		}
		if batch := envInt("WAN_BATCH", 0); batch > 0 {
			c.Workload.Config["batch_size"] = batch
		}
		if steps := envInt("WAN_INNER_STEPS", 0); steps > 0 {
			c.Protocol.InnerSteps = steps
		}
		if codec == "sparse" {
			c.Protocol.DiLoCo.Momentum = 0
		}
		c.Protocol.Overlap = os.Getenv("WAN_OVERLAP")
	})
	requirePython(t, procs[0].Cfg.Workload.Interpreter)
	for _, p := range procs {
		p.Start()
	}
	type sample struct {
		at    time.Time
		bytes []wan.Counters
	}
	counters := func() []wan.Counters {
		var out []wan.Counters
		for _, n := range lab.Nodes[1:] {
			c, err := n.Counters()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, c)
		}
		return out
	}
	heads := map[int]sample{}
	deadline := time.Now().Add(time.Duration(rounds)*2*time.Minute + 3*time.Minute)
	for len(heads) <= rounds {
		if time.Now().After(deadline) {
			t.Fatalf("the swarm reached %d of %d rounds in time", len(heads)-1, rounds)
		}
		for _, m := range headLine.FindAllStringSubmatch(procs[0].Output(), -1) {
			r, _ := strconv.Atoi(m[1])
			if _, ok := heads[r]; !ok {
				heads[r] = sample{at: time.Now(), bytes: counters()}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range procs {
		if err := p.Wait(2 * time.Minute); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
	}
	// The fp32 size of the model: the genesis params pack.
	stores, err := node.OpenStores(procs[0].Cfg)
	if err != nil {
		t.Fatal(err)
	}
	tip, err := stores.ResolveHead("latest")
	if err != nil {
		t.Fatal(err)
	}
	_, h, err := stores.Heads.Get(tip)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := h.ParamsID()
	pm, err := stores.Artifacts.Manifest(pid)
	if err != nil {
		t.Fatal(err)
	}
	modelBytes := pm.Size

	links := fmt.Sprintf("links %.0f/%.0f Mbit/s up/down", envFloat("WAN_UP_MBIT", 20), envFloat("WAN_DOWN_MBIT", 100))
	if path := os.Getenv("WAN_SPEC"); path != "" {
		links = "links as in " + path
	}
	fmt.Printf("\nWAN swarm: %d trainers, %s, overlap %q, %d rounds, %s, fp32 model %d bytes\n",
		trainers, codec, os.Getenv("WAN_OVERLAP"), rounds, links, modelBytes)
	// Whose contributions each round's head merged (issue 46 item 4: every trainer in
	// every round after it joined; here all start together).
	merged := map[int]map[string]bool{}
	for _, h := range procs[0].HeadChain(t) {
		merged[int(h.Round)] = map[string]bool{}
		for _, c := range h.Contributions {
			merged[int(h.Round)][c.Peer] = true
		}
	}
	fmt.Printf("%-10s %5s %12s %12s %9s %9s %9s %9s %6s %7s\n", "trainer", "round", "sent B", "received B", "sent %", "recv %", "train s", "round s", "util", "merged")
	for ti, p := range procs[1:] {
		id := p.peerID(t)
		nMerged := 0
		train := map[int]float64{}
		for _, m := range trainedLine.FindAllStringSubmatch(p.Logs(), -1) {
			r, _ := strconv.Atoi(m[1])
			s, _ := strconv.ParseFloat(m[2], 64)
			train[r] += s
		}
		var sumTrain float64
		var sumSent uint64
		for r := 1; r <= rounds; r++ {
			d := heads[r].bytes[ti].Sub(heads[r-1].bytes[ti])
			wall := heads[r].at.Sub(heads[r-1].at).Seconds()
			sumTrain += train[r]
			sumSent += d.TxBytes
			in := "no"
			if merged[r][id] {
				in = "yes"
				nMerged++
			}
			fmt.Printf("%-10s %5d %12d %12d %8.1f%% %8.1f%% %9.2f %9.2f %5.0f%% %7s\n", p.Name, r, d.TxBytes, d.RxBytes,
				100*float64(d.TxBytes)/float64(modelBytes), 100*float64(d.RxBytes)/float64(modelBytes), train[r], wall, 100*train[r]/wall, in)
			if d.TxBytes == 0 || d.RxBytes == 0 {
				t.Errorf("%s round %d: no bytes on its wire", p.Name, r)
			}
		}
		wall := heads[rounds].at.Sub(heads[0].at).Seconds()
		fmt.Printf("%-10s %5s %12d %12s %9s %9s %9.2f %9.2f %5.0f%% %7s\n", p.Name, "all", sumSent, "", "", "", sumTrain, wall, 100*sumTrain/wall,
			fmt.Sprintf("%d/%d", nMerged, rounds))
		// After joining: round 1 holds the first dense download and, with overlap, the only
		// window nobody trained ahead. A window trained ahead counts in the round it was
		// leased for, though it started during the round before.
		if rounds > 1 {
			steady := sumTrain - train[1]
			wall := heads[rounds].at.Sub(heads[1].at).Seconds()
			fmt.Printf("%-10s %5s %12s %12s %9s %9s %9.2f %9.2f %5.0f%%\n", p.Name, fmt.Sprintf("2-%d", rounds), "", "", "", "", steady, wall, 100*steady/wall)
		}
		if sumTrain == 0 {
			t.Errorf("%s logged no training", p.Name)
		}
		if nMerged < rounds {
			t.Errorf("%s was merged in %d of %d rounds", p.Name, nMerged, rounds)
		}
	}
}

// swarmSpec loads the lab spec at path (relative to the repository root, where make runs,
// or absolute) for a swarm: its nodes must be the validator, then trainer-1, …; it
// returns the spec and the number of trainers.
func swarmSpec(t *testing.T, path string) (wan.LabSpec, int) {
	t.Helper()
	if !filepath.IsAbs(path) {
		// go test runs in e2e/.
		path = filepath.Join("..", path)
	}
	spec, err := wan.LoadSpec(path)
	if err != nil {
		t.Fatal(err)
	}
	trainers := len(spec.Nodes) - 1
	for i, n := range spec.Nodes {
		if want := demo.Names(trainers)[i]; n.Name != want {
			t.Fatalf("WAN_SPEC %s: node %d is %q, want %q (the validator, then trainer-1, …)", path, i, n.Name, want)
		}
	}
	return spec, trainers
}

// labYamux is the node's yamux (p2p.Yamux) with frames of at most maxMessage bytes and,
// with WAN_YAMUX_INIT_WINDOW, that initial stream window (bytes; yamux's is 256 KiB).
func labYamux(maxMessage uint32) *yamux.Transport {
	t := p2p.Yamux(maxMessage)
	if w := envInt("WAN_YAMUX_INIT_WINDOW", 0); w > 0 {
		t.InitialStreamWindowSize = uint32(w)
	}
	return t
}
