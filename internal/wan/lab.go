// Package wan emulates a wide-area network on one Linux machine for tests and measurements:
// every node gets its own network namespace and a TUN device with an address from
// 198.18.0.0/15 (the range set aside for network benchmarks); a forwarder in the lab's
// process carries the packets between the devices, applying each link's one-way delay,
// jitter, random loss and downlink rate, while tbf on the device limits the uplink. A node
// behind a home router sits in a namespace of its own behind a router namespace that holds
// the TUN device and translates addresses with nftables (NAT kinds: cone, symmetric,
// closed). Bytes on the wire are read from the interfaces' counters, not from anything the
// nodes report.
//
// This kernel has tbf but neither netem nor fq, hence the userspace delay line. Everything
// is created by New and removed by Close, which first ends the processes still running in
// the lab's namespaces (nodes cut off from every network otherwise run on); namespaces left
// by a run that was killed are removed by the next New (their names carry the pid that made
// them), the TUN devices die with the process that opened them, nftables rules with their
// namespace, and the commands it started die with it (Command). It needs root and the ip
// and tc commands (nft for NAT), and says so when they are missing.
package wan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// NamePrefix starts the name of every namespace the lab creates.
const NamePrefix = "p2pwan-"

// Node is one node of the lab.
type Node struct {
	Name string
	NS   string // namespace name, for `ip netns exec`
	// Addr is the address the node has and listens on: its public address (198.18.0.x), or
	// behind a router its address on the home network (198.19.x.2).
	Addr string
	// Public is the address the rest of the lab sees it at (its router's, behind NAT).
	Public string
	Link   Link
	NAT    NAT
	// Router is the router's namespace behind NAT, "" otherwise.
	Router string
}

// Lab is a set of namespaces joined by a forwarder.
type Lab struct {
	Nodes []*Node
	Fwd   *Forwarder

	tuns      []*os.File
	closeOnce sync.Once
	closeErr  error
	stopSig   chan struct{}
}

// ErrUnavailable: the machine cannot run the lab (not root, no ip or tc, no tbf).
var ErrUnavailable = errors.New("wan lab unavailable")

// Check reports why the lab cannot run here, or nil.
func Check() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: network namespaces, TUN devices and tc need root (run as root, e.g. sudo make wan)", ErrUnavailable)
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w: %q not found on PATH (Debian: apt-get install iproute2)", ErrUnavailable, tool)
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("%w: no /dev/net/tun (the delay line needs TUN devices): %w", ErrUnavailable, err)
	}
	return nil
}

// CheckNAT reports why a lab with home routers cannot run here, or nil.
func CheckNAT() error {
	if err := Check(); err != nil {
		return err
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return fmt.Errorf("%w: %q not found on PATH (Debian: apt-get install nftables)", ErrUnavailable, "nft")
	}
	return nil
}

func run(args ...string) error { return runIn(nil, args...) }

func runIn(stdin []byte, args ...string) error {
	cmd := exec.Command(args[0], args[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// New builds a lab of specs (see NewLab).
func New(specs []Spec) (*Lab, error) { return NewLab(LabSpec{Nodes: specs}) }

// NewLab creates a namespace per node (public addresses 198.18.0.1, .2, … in order), a router
// namespace per node behind NAT, a TUN device per link, and starts the forwarder. Stale
// namespaces of dead runs are removed first. On an interrupt (SIGINT, SIGTERM) before Close,
// the lab removes itself and the process exits.
func NewLab(s LabSpec) (*Lab, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	check := Check
	for _, n := range s.Nodes {
		if n.NAT != NATNone {
			check = CheckNAT
		}
	}
	if err := check(); err != nil {
		return nil, err
	}
	RemoveStale()
	pid := os.Getpid()
	tag := NamePrefix + strconv.Itoa(pid) + "-"
	l := &Lab{Fwd: NewForwarder(), stopSig: make(chan struct{})}
	l.watchSignals()
	if err := l.build(tag, pid, s); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func (l *Lab) build(tag string, pid int, s LabSpec) error {
	for i, sp := range s.Nodes {
		n := &Node{Name: sp.Name, NS: tag + sp.Name, Public: fmt.Sprintf("198.18.0.%d", i+1), Link: sp.Link, NAT: sp.NAT}
		n.Addr = n.Public
		l.Nodes = append(l.Nodes, n)
		if err := run("ip", "netns", "add", n.NS); err != nil {
			return err
		}
		wanNS := n.NS // the namespace that holds the TUN device and the public address
		var steps [][]string
		if sp.NAT != NATNone {
			n.Router = tag + "r" + strconv.Itoa(i+1)
			n.Addr = fmt.Sprintf("198.19.%d.2", i+1)
			gw := fmt.Sprintf("198.19.%d.1", i+1)
			wanNS = n.Router
			if err := run("ip", "netns", "add", n.Router); err != nil {
				return err
			}
			steps = append(steps,
				[]string{"ip", "-n", n.Router, "link", "set", "lo", "up"},
				[]string{"ip", "-n", n.Router, "link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", n.NS},
				[]string{"ip", "-n", n.Router, "addr", "add", gw + "/24", "dev", "lan0"},
				[]string{"ip", "-n", n.Router, "link", "set", "lan0", "up"},
				[]string{"ip", "netns", "exec", n.Router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"},
				[]string{"ip", "-n", n.NS, "addr", "add", n.Addr + "/24", "dev", "eth0"},
				[]string{"ip", "-n", n.NS, "link", "set", "eth0", "up"},
				[]string{"ip", "-n", n.NS, "route", "add", "default", "via", gw},
			)
		}
		tunName := fmt.Sprintf("p2pw%dt%d", pid, i+1)
		tun, err := openTUN(tunName)
		if err != nil {
			return fmt.Errorf("wan lab: node %s: %w", n.Name, err)
		}
		l.tuns = append(l.tuns, tun)
		dev := "eth0" // the counters and the e2e harness read eth0: on a public node the link
		if sp.NAT != NATNone {
			dev = "wan0"
		}
		steps = append([][]string{
			{"ip", "-n", n.NS, "link", "set", "lo", "up"},
			{"ip", "link", "set", "dev", tunName, "netns", wanNS},
			{"ip", "-n", wanNS, "link", "set", "dev", tunName, "name", dev},
			{"ip", "-n", wanNS, "link", "set", "dev", dev, "mtu", strconv.Itoa(mtu)},
			{"ip", "-n", wanNS, "addr", "add", n.Public + "/16", "dev", dev},
			{"ip", "-n", wanNS, "link", "set", dev, "up"},
		}, steps...)
		if sp.UpMbit > 0 {
			steps = append(steps, tbf(wanNS, dev, sp.UpMbit, sp.queue()))
		}
		for _, st := range steps {
			if err := run(st...); err != nil {
				return fmt.Errorf("wan lab: node %s: %w", n.Name, err)
			}
		}
		if sp.NAT != NATNone {
			if err := runIn([]byte(natRules(sp.NAT)), "ip", "netns", "exec", n.Router, "nft", "-f", "-"); err != nil {
				return fmt.Errorf("wan lab: node %s: router (nat %s): %w", n.Name, sp.NAT, err)
			}
		}
		l.Fwd.Add(n.Name, tun, netip.MustParseAddr(n.Public), sp.port(s.Seed+uint64(i)))
	}
	return nil
}

// tbf is the command that limits dev's egress in namespace ns to mbit. The bucket holds
// 4 ms at the rate (at least 32 KiB), so one sender cannot burst far past the rate, and the
// queue holds queue's worth of packets, like a router's.
func tbf(ns, dev string, mbit float64, queue time.Duration) []string {
	burst := max(32<<10, int(mbit*1e6/8*0.004))
	return []string{"tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
		"rate", fmt.Sprintf("%dkbit", int(mbit*1000)), "burst", strconv.Itoa(burst), "latency", fmt.Sprintf("%dms", queue.Milliseconds())}
}

// watchSignals removes the lab when the process is interrupted before Close.
func (l *Lab) watchSignals() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		select {
		case sig := <-ch:
			l.Close()
			fmt.Fprintf(os.Stderr, "wan lab: %v: namespaces removed\n", sig)
			os.Exit(130)
		case <-l.stopSig:
			signal.Stop(ch)
		}
	}()
}

// Close ends the processes still running in the lab's namespaces, stops the forwarder,
// closes the TUN devices (which removes them) and deletes every namespace (veth pairs and
// nftables rules go with them).
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		var errs []error
		for _, n := range l.Nodes {
			if err := killIn(n.NS); err != nil {
				errs = append(errs, err)
			}
		}
		l.Fwd.Close()
		for _, f := range l.tuns {
			f.Close()
		}
		l.Fwd.Wait()
		for _, n := range l.Nodes {
			for _, ns := range []string{n.NS, n.Router} {
				if ns == "" {
					continue
				}
				if err := run("ip", "netns", "del", ns); err != nil {
					errs = append(errs, err)
				}
			}
		}
		close(l.stopSig)
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// killIn sends SIGKILL to every process in namespace ns and waits (up to 5 s) until none is
// left: deleting a namespace only unnames it, and its processes would run on, cut off.
func killIn(ns string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := exec.Command("ip", "netns", "pids", ns).Output()
		if err != nil {
			return fmt.Errorf("ip netns pids %s: %w", ns, err)
		}
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("namespace %s: processes %s still running after SIGKILL", ns, strings.Join(pids, " "))
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Namespaces lists the namespaces on the machine whose names start with NamePrefix.
func Namespaces() []string {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return nil
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], NamePrefix) {
			names = append(names, f[0])
		}
	}
	return names
}

// RemoveStale deletes lab namespaces whose creating process no longer runs, ending the
// processes left in them.
func RemoveStale() {
	for _, ns := range Namespaces() {
		pidStr, _, _ := strings.Cut(strings.TrimPrefix(ns, NamePrefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if err == nil && pid != os.Getpid() && syscall.Kill(pid, 0) == nil {
			continue // its run is still going
		}
		if pid != os.Getpid() {
			_ = killIn(ns)
			_ = run("ip", "netns", "del", ns)
		}
	}
}

// Command returns a command that runs in n's namespace. It is killed when the process that
// started it dies, even by SIGKILL (PR_SET_PDEATHSIG, which `ip netns exec` keeps across its
// exec of name), so a killed run leaves no node behind.
func (n *Node) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.NS, name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// Counters are an interface's byte counters (Ethernet frames, as sent and received).
type Counters struct {
	TxBytes, RxBytes uint64
}

// Sub returns c − o.
func (c Counters) Sub(o Counters) Counters {
	return Counters{TxBytes: c.TxBytes - o.TxBytes, RxBytes: c.RxBytes - o.RxBytes}
}

// Counters reads the byte counters of n's eth0: Tx is what n sent up its link, Rx what it
// received.
func (n *Node) Counters() (Counters, error) {
	out, err := exec.Command("ip", "-n", n.NS, "-j", "-s", "link", "show", "dev", "eth0").Output()
	if err != nil {
		return Counters{}, fmt.Errorf("counters of %s: %w", n.Name, err)
	}
	var links []struct {
		Stats struct {
			Rx struct{ Bytes uint64 } `json:"rx"`
			Tx struct{ Bytes uint64 } `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return Counters{}, fmt.Errorf("counters of %s: unexpected ip output %q", n.Name, out)
	}
	return Counters{TxBytes: links[0].Stats.Tx.Bytes, RxBytes: links[0].Stats.Rx.Bytes}, nil
}
