//go:build wan

package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/internal/wan"
	"github.com/p2pnode/p2pnode/p2p"
)

// Hole punching between two peers behind home routers that meet through a public relay.
// Every host is the node's own (p2p.NewHost: circuit relay v2 client, DCUtR hole punching,
// AutoNAT service; the relay with node.relay), each in a process of its own in its
// namespace, fresh for every attempt (new key, new ports).

// punchHost is the node's libp2p host listening on listen; relay makes it a relay server
// (node.relay, with node.relay_limit's defaults).
func punchHost(t *testing.T, listen []string, relay bool) (host.Host, *prometheus.Registry) {
	p2p.LabAddressClasses()
	cfg := config.Default()
	cfg.Node.Listen = listen
	cfg.Node.Relay = relay
	cfg.Experiment.Roles = []string{config.RoleTrainer}
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	h, err := p2p.NewHost(cfg, key, metrics.NewBandwidthCounter(), reg, log)
	if err != nil {
		t.Fatal(err)
	}
	return h, reg
}

// punchListen is the listen address of transport on addr and port.
func punchListen(transport, addr string, port int) string {
	if transport == "quic" {
		return fmt.Sprintf("/ip4/%s/udp/%d/quic-v1", addr, port)
	}
	return fmt.Sprintf("/ip4/%s/tcp/%d", addr, port)
}

// relayHop is the protocol a circuit relay v2 server answers reservations on.
const relayHop = "/libp2p/circuit/relay/0.2.0/hop"

// hpRelay: the public relay. It prints UP <tcp addr> <quic addr> at once and READY
// <seconds> when it serves as a relay: go-libp2p starts the relay service only once AutoNAT
// finds the host publicly reachable, which takes peers (the warmers) that dial it back.
// It serves until stdin closes.
func hpRelay(t *testing.T) {
	addr := os.Getenv("P2PWAN_ADDR")
	start := time.Now()
	h, _ := punchHost(t, []string{punchListen("tcp", addr, 4001), punchListen("quic", addr, 4001)}, true)
	defer h.Close()
	fmt.Printf("UP %s/p2p/%s %s/p2p/%s\n", punchListen("tcp", addr, 4001), h.ID(), punchListen("quic", addr, 4001), h.ID())
	for !slices.Contains(h.Mux().Protocols(), relayHop) {
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("READY %.1f\n", time.Since(start).Seconds())
	io.Copy(io.Discard, os.Stdin)
}

// hpWarmer: a public peer that connects to the relay (P2PWAN_RELAY) and stays, so that the
// relay's AutoNAT has a peer to ask for a dial back. AutoNAT (v1, which the node runs) asks
// only peers that advertise a public address, and a peer behind NAT turns its own AutoNAT
// service off once it finds itself private: peers behind NAT cannot vouch for the relay.
func hpWarmer(t *testing.T) {
	h, _ := punchHost(t, []string{punchListen("tcp", os.Getenv("P2PWAN_ADDR"), 0)}, false)
	defer h.Close()
	relay, err := peer.AddrInfoFromString(os.Getenv("P2PWAN_RELAY"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.Connect(ctx, *relay); err != nil {
		fmt.Printf("SETUP connect-relay %v\n", oneLine(err))
	}
	io.Copy(io.Discard, os.Stdin)
}

// dcutrReady waits until h's hole punching service handles DCUtR streams, which it does
// once it knows a public address of its own (observed by the relay through identify).
func dcutrReady(h host.Host, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if slices.Contains(h.Mux().Protocols(), holepunch.Protocol) {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// hpOutcome is the outcome of h's hole punches as the DCUtR initiator, from libp2p's own
// metrics: "success", "failed", "no_suitable_address", "cancelled", or "" when none ended.
func hpOutcome(reg *prometheus.Registry) (string, string) {
	mfs, err := reg.Gather()
	if err != nil {
		return "", ""
	}
	for _, mf := range mfs {
		if mf.GetName() != "libp2p_holepunch_outcomes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetCounter().GetValue() == 0 {
				continue
			}
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["side"] == "initiator" {
				return labels["outcome"], labels["num_attempts"]
			}
		}
	}
	return "", ""
}

// hpListener: the peer that is dialed through the relay, and so starts the hole punch
// (DCUtR's initiator). It connects to the relay (P2PWAN_RELAY), reserves a slot, waits
// until its hole punching service runs and prints READY <peer id> (or SETUP <why>); then
// it waits up to 60 s for its hole punch to end and prints OUTCOME <outcome> <attempts>,
// and runs until stdin closes.
func hpListener(t *testing.T) {
	transport, addr := os.Getenv("P2PWAN_HP_TRANSPORT"), os.Getenv("P2PWAN_ADDR")
	h, reg := punchHost(t, []string{punchListen(transport, addr, 0)}, false)
	defer h.Close()
	relay, err := peer.AddrInfoFromString(os.Getenv("P2PWAN_RELAY"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.Connect(ctx, *relay); err != nil {
		fmt.Printf("SETUP connect-relay %v\n", oneLine(err))
		return
	}
	if _, err := client.Reserve(ctx, h, *relay); err != nil {
		fmt.Printf("SETUP reserve %v\n", oneLine(err))
		return
	}
	if !dcutrReady(h, 30*time.Second) {
		fmt.Printf("SETUP no-public-address %v\n", h.Addrs())
		return
	}
	fmt.Printf("READY %s\n", h.ID())
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			fmt.Println("OUTCOME none -")
			return
		case <-deadline:
			fmt.Println("OUTCOME none -")
			<-done
			return
		case <-tick.C:
			if o, n := hpOutcome(reg); o != "" {
				fmt.Printf("OUTCOME %s %s\n", o, n)
				<-done
				return
			}
		}
	}
}

// hpDialer: the peer that dials the listener (P2PWAN_PEER) through the relay and watches
// for a direct connection to it. It prints DIALED once the relayed connection stands,
// DIRECT <seconds since dialing> <remote address> when a direct connection appears, and
// END when stdin closes.
func hpDialer(t *testing.T) {
	transport, addr := os.Getenv("P2PWAN_HP_TRANSPORT"), os.Getenv("P2PWAN_ADDR")
	h, _ := punchHost(t, []string{punchListen(transport, addr, 0)}, false)
	defer h.Close()
	relay, err := peer.AddrInfoFromString(os.Getenv("P2PWAN_RELAY"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := peer.Decode(os.Getenv("P2PWAN_PEER"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	defer fmt.Println("END")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.Connect(ctx, *relay); err != nil {
		fmt.Printf("SETUP connect-relay %v\n", oneLine(err))
		<-done
		return
	}
	if !dcutrReady(h, 30*time.Second) {
		fmt.Printf("SETUP no-public-address %v\n", h.Addrs())
		<-done
		return
	}
	circuit, err := ma.NewMultiaddr(relay.Addrs[0].String() + "/p2p/" + relay.ID.String() + "/p2p-circuit")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := h.Connect(network.WithAllowLimitedConn(ctx, "hole punch measurement"), peer.AddrInfo{ID: other, Addrs: []ma.Multiaddr{circuit}}); err != nil {
		fmt.Printf("SETUP dial-through-relay %v\n", oneLine(err))
		<-done
		return
	}
	fmt.Println("DIALED")
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			for _, c := range h.Network().ConnsToPeer(other) {
				if _, err := c.RemoteMultiaddr().ValueForProtocol(ma.P_CIRCUIT); err != nil {
					fmt.Printf("DIRECT %.3f %s\n", time.Since(start).Seconds(), c.RemoteMultiaddr())
					<-done
					return
				}
			}
		}
	}
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", " ") }

// lineProc is a helper process whose output lines arrive on a channel.
type lineProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan []string
}

// startLineProc runs the test binary in n's namespace as role. It returns an error, not
// failing the test, as the attempts call it from goroutines of their own.
func startLineProc(n *wan.Node, role string, env ...string) (*lineProc, error) {
	cmd := n.Command(os.Args[0], "-test.run=^TestWANHelper$", "-test.v=false")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+role, "P2PWAN_ADDR="+n.Addr), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s in %s: %w", role, n.Name, err)
	}
	p := &lineProc{cmd: cmd, stdin: stdin, lines: make(chan []string, 16)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) > 0 {
				p.lines <- f
			}
		}
	}()
	return p, nil
}

// next returns the next line whose first field is one of want, or nil when the process
// ends or within passes first.
func (p *lineProc) next(within time.Duration, want ...string) []string {
	timeout := time.After(within)
	for {
		select {
		case f, ok := <-p.lines:
			if !ok {
				return nil
			}
			if slices.Contains(want, f[0]) {
				return f
			}
		case <-timeout:
			return nil
		}
	}
}

// stop closes stdin (the helper closes its host) and ends the process.
func (p *lineProc) stop() {
	p.stdin.Close()
	exited := make(chan struct{})
	go func() {
		for range p.lines {
		}
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(3 * time.Second):
		p.cmd.Process.Kill()
	}
	p.cmd.Wait()
}

// punchResult is one attempt.
type punchResult struct {
	setup    string // why the attempt never reached the hole punch, "" if it did
	direct   bool
	secs     float64 // dial through the relay to direct connection
	outcome  string  // the initiator's DCUtR outcome (libp2p's metrics), "none" if it did not end
	attempts string  // DCUtR rounds the initiator made
}

// punchOnce runs one attempt: a fresh listener behind a, reserved on the relay, and a fresh
// dialer behind b that reaches it through the relay.
func punchOnce(t *testing.T, a, b *wan.Node, transport, relayAddr string) punchResult {
	env := []string{"P2PWAN_HP_TRANSPORT=" + transport, "P2PWAN_RELAY=" + relayAddr}
	lst, err := startLineProc(a, "hp-listener", env...)
	if err != nil {
		return punchResult{setup: "listener: " + err.Error()}
	}
	defer lst.stop()
	f := lst.next(45*time.Second, "READY", "SETUP")
	if f == nil {
		return punchResult{setup: "listener: no READY"}
	}
	if f[0] == "SETUP" {
		t.Logf("listener behind %s: %s", a.Name, strings.Join(f[1:], " "))
		return punchResult{setup: "listener: " + f[1]}
	}
	dl, err := startLineProc(b, "hp-dialer", append(env, "P2PWAN_PEER="+f[1])...)
	if err != nil {
		return punchResult{setup: "dialer: " + err.Error()}
	}
	defer dl.stop()
	if f := dl.next(45*time.Second, "DIALED", "SETUP"); f == nil || f[0] == "SETUP" {
		why := "no DIALED"
		if f != nil {
			why = f[1]
			t.Logf("dialer behind %s: %s", b.Name, strings.Join(f[1:], " "))
		}
		return punchResult{setup: "dialer: " + why}
	}
	r := punchResult{outcome: "none", attempts: "-"}
	if o := lst.next(75*time.Second, "OUTCOME"); o != nil {
		r.outcome, r.attempts = o[1], o[2]
	}
	// The dialer sees the direct connection about when the initiator's dial ends.
	if d := dl.next(3*time.Second, "DIRECT"); d != nil {
		r.direct = true
		r.secs, _ = strconv.ParseFloat(d[1], 64)
	}
	return r
}

// punchPair is the kinds of home router in front of the listener (DCUtR's initiator) and
// the dialer.
type punchPair struct{ listener, dialer wan.NAT }

func (p punchPair) String() string {
	if p.listener == p.dialer {
		return string(p.listener)
	}
	return string(p.listener) + "/" + string(p.dialer)
}

// TestWANHolePunch measures DCUtR hole punching between two peers behind home routers that
// meet through a public relay, over TCP and over QUIC: both behind the same kind (cone,
// symmetric, closed), and cone with symmetric either way round. WAN_HP_ATTEMPTS (50)
// attempts per pair of kinds and transport, WAN_HP_PAIRS (5) pairs of homes per pair of
// kinds at a time, every home WAN_HP_RTT_MS (40) ms from the core (± WAN_HP_JITTER_MS, 0;
// WAN_HP_LOSS_PCT, 0, lost each way) on 20/100 Mbit/s, the relay 20 ms; WAN_HP_KINDS
// (e.g. "cone,cone/symmetric") and WAN_HP_TRANSPORTS ("tcp,quic") pick the rows. Each
// attempt starts fresh processes with new keys: the listener reserves a slot on the relay,
// the dialer reaches it through the relay, and the listener's hole punching service
// (go-libp2p's, as the node runs it) tries to turn that into a direct connection. It prints
// a table per pair of kinds and transport. It asserts only what the lab's routers decide:
// no direct TCP connection through the closed kind (it drops inbound bare SYNs), at least
// one between two cone routers, and every attempt reaching the hole punch.
func TestWANHolePunch(t *testing.T) {
	attempts := envInt("WAN_HP_ATTEMPTS", 50)
	pairs := envInt("WAN_HP_PAIRS", 5)
	kinds := []punchPair{{wan.NATCone, wan.NATCone}, {wan.NATSymmetric, wan.NATSymmetric}, {wan.NATClosed, wan.NATClosed},
		{wan.NATCone, wan.NATSymmetric}, {wan.NATSymmetric, wan.NATCone}}
	if only := os.Getenv("WAN_HP_KINDS"); only != "" {
		kinds = slices.DeleteFunc(kinds, func(k punchPair) bool { return !slices.Contains(strings.Split(only, ","), k.String()) })
		if len(kinds) == 0 {
			t.Fatalf("WAN_HP_KINDS=%q: no such pair of kinds (cone, symmetric, closed, cone/symmetric, symmetric/cone)", only)
		}
	}
	transports := []string{"tcp", "quic"}
	if tr := os.Getenv("WAN_HP_TRANSPORTS"); tr != "" {
		transports = strings.Split(tr, ",")
	}
	home := wan.Link{UpMbit: 20, DownMbit: 100, RTT: time.Duration(envFloat("WAN_HP_RTT_MS", 40) * float64(time.Millisecond)),
		Jitter: time.Duration(envFloat("WAN_HP_JITTER_MS", 0) * float64(time.Millisecond))}
	home.LossPct, _ = strconv.ParseFloat(os.Getenv("WAN_HP_LOSS_PCT"), 64)
	spec := wan.LabSpec{Seed: 46, Nodes: []wan.Spec{{Name: "relay", Link: wan.Link{RTT: 20 * time.Millisecond}}, {Name: "public", Link: home}}}
	homeName := func(k punchPair, side string, i int) string {
		return fmt.Sprintf("%s-%s%d", strings.ReplaceAll(k.String(), "/", "-"), side, i+1)
	}
	for _, k := range kinds {
		for i := range pairs {
			spec.Nodes = append(spec.Nodes,
				wan.Spec{Name: homeName(k, "a", i), Link: home, NAT: k.listener},
				wan.Spec{Name: homeName(k, "b", i), Link: home, NAT: k.dialer})
		}
	}
	lab := newLab(t, spec)
	node := map[string]*wan.Node{}
	for _, n := range lab.Nodes {
		node[n.Name] = n
	}
	relay, err := startLineProc(lab.Nodes[0], "hp-relay")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relay.stop)
	up := relay.next(30*time.Second, "UP")
	if up == nil {
		t.Fatal("the relay did not start")
	}
	relayAddr := map[string]string{"tcp": up[1], "quic": up[2]}
	// The relay serves once its AutoNAT hears back from a public peer.
	w, err := startLineProc(node["public"], "hp-warmer", "P2PWAN_RELAY="+relayAddr["tcp"])
	if err != nil {
		t.Fatal(err)
	}
	defer w.stop()
	ready := relay.next(3*time.Minute, "READY")
	if ready == nil {
		t.Fatal("the relay did not start its relay service within 3 minutes (AutoNAT never found it public)")
	}
	t.Logf("relay service up %s s after the relay's start", ready[1])

	type key struct {
		kind      punchPair
		transport string
	}
	results := map[key][]punchResult{}
	var mu sync.Mutex
	for _, tr := range transports {
		start := time.Now()
		var wg sync.WaitGroup
		for _, k := range kinds {
			next := 0
			var kmu sync.Mutex
			for i := range pairs {
				a, b := node[homeName(k, "a", i)], node[homeName(k, "b", i)]
				wg.Go(func() {
					for {
						kmu.Lock()
						mine := next < attempts
						next++
						kmu.Unlock()
						if !mine {
							return
						}
						r := punchOnce(t, a, b, tr, relayAddr[tr])
						mu.Lock()
						results[key{k, tr}] = append(results[key{k, tr}], r)
						mu.Unlock()
					}
				})
			}
		}
		wg.Wait()
		t.Logf("%s: %d attempts per pair of kinds in %v", tr, attempts, time.Since(start).Round(time.Second))
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\nDCUtR hole punching between two peers behind home routers (listener/dialer), through a relay, %d attempts each;\n"+
		"homes %v from the core, jitter %v, loss %g %% each way\n", attempts, home.RTT, home.Jitter, home.LossPct)
	fmt.Fprintf(&b, "%-16s %-5s %8s %8s %8s %10s  %s\n", "nat", "tx", "reached", "direct", "rate", "median s", "initiator outcome/DCUtR rounds (libp2p metrics), setup failures")
	var problems []string
	for _, tr := range transports {
		for _, k := range kinds {
			rs := results[key{k, tr}]
			reached, direct := 0, 0
			var secs []float64
			outcomes := map[string]int{}
			for _, r := range rs {
				if r.setup != "" {
					outcomes["setup: "+r.setup]++
					continue
				}
				reached++
				outcomes[r.outcome+"/"+r.attempts]++
				if r.direct {
					direct++
					secs = append(secs, r.secs)
				}
			}
			var oc []string
			for o, n := range outcomes {
				oc = append(oc, fmt.Sprintf("%s ×%d", o, n))
			}
			sort.Strings(oc)
			rate, med := 0.0, 0.0
			if reached > 0 {
				rate = 100 * float64(direct) / float64(reached)
			}
			if len(secs) > 0 {
				slices.Sort(secs)
				med = secs[len(secs)/2]
			}
			fmt.Fprintf(&b, "%-16s %-5s %8d %8d %7.0f%% %10.2f  %s\n", k, tr, reached, direct, rate, med, strings.Join(oc, ", "))
			if reached < len(rs) {
				problems = append(problems, fmt.Sprintf("%s/%s: %d of %d attempts never reached the hole punch", k, tr, len(rs)-reached, len(rs)))
			}
			if (k.listener == wan.NATClosed || k.dialer == wan.NATClosed) && tr == "tcp" && direct > 0 {
				problems = append(problems, fmt.Sprintf("%s/tcp: %d direct connections through a router that drops inbound SYNs", k, direct))
			}
			if k == (punchPair{wan.NATCone, wan.NATCone}) && direct == 0 {
				problems = append(problems, fmt.Sprintf("cone/%s: no direct connection in %d attempts", tr, len(rs)))
			}
		}
	}
	fmt.Print(b.String())
	if len(problems) > 0 {
		t.Fatal(strings.Join(problems, "; "))
	}
}
