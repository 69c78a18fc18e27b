// Package wan emulates a wide-area network on one Linux machine for tests and measurements:
// every node gets its own network namespace, joined by a veth pair to a bridge in a hub
// namespace, with an address from 198.18.0.0/15 (the range set aside for network
// benchmarks), and per-node rate limits set with tc tbf on both ends of its pair (egress of
// the node's side is its uplink, egress of the hub's side its downlink). Bytes on the wire
// are read from the interfaces' counters, not from anything the nodes report.
//
// This kernel has tbf but not netem, so the lab adds no latency; links are rate-limited
// only. Everything is created by New and removed by Close, which first ends the processes
// still running in the lab's namespaces (nodes cut off from every network otherwise run on);
// namespaces left by a run that was killed are removed by the next New (their names carry
// the pid that made them), and the commands it started die with it (Command). It needs
// root and the ip and tc commands, and says so when they are missing.
package wan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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

// Link is one node's connection: rates in Mbit/s, 0 for unshaped.
type Link struct {
	UpMbit, DownMbit float64
}

// Spec names a node and its link.
type Spec struct {
	Name string
	Link Link
}

// Node is one namespace of the lab.
type Node struct {
	Name string
	NS   string // namespace name, for `ip netns exec`
	Addr string // IPv4 address inside the lab (198.18.0.x)
	Link Link
	hub  string // the hub side of its veth pair
}

// Lab is a set of namespaces on one bridge.
type Lab struct {
	Nodes []*Node
	hub   string

	closeOnce sync.Once
	closeErr  error
	stopSig   chan struct{}
}

// ErrUnavailable: the machine cannot run the lab (not root, no ip or tc, no tbf).
var ErrUnavailable = errors.New("wan lab unavailable")

// Check reports why the lab cannot run here, or nil.
func Check() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: network namespaces and tc need root (run as root, e.g. sudo make wan)", ErrUnavailable)
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w: %q not found on PATH (Debian: apt-get install iproute2)", ErrUnavailable, tool)
		}
	}
	return nil
}

func run(args ...string) error {
	cmd := exec.Command(args[0], args[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// New creates a namespace per spec (addresses 198.18.0.1, .2, … in order) and a hub with the
// bridge, and shapes each link. Stale namespaces of dead runs are removed first. On an
// interrupt (SIGINT, SIGTERM) before Close, the lab removes itself and the process exits.
func New(specs []Spec) (*Lab, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	if len(specs) == 0 || len(specs) > 250 {
		return nil, fmt.Errorf("wan lab: %d nodes, want 1 to 250", len(specs))
	}
	RemoveStale()
	tag := NamePrefix + strconv.Itoa(os.Getpid()) + "-"
	l := &Lab{hub: tag + "hub", stopSig: make(chan struct{})}
	l.watchSignals()
	if err := l.build(tag, specs); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func (l *Lab) build(tag string, specs []Spec) error {
	if err := run("ip", "netns", "add", l.hub); err != nil {
		return err
	}
	steps := [][]string{
		{"ip", "-n", l.hub, "link", "set", "lo", "up"},
		{"ip", "-n", l.hub, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", l.hub, "link", "set", "br0", "up"},
	}
	for i, s := range specs {
		n := &Node{Name: s.Name, NS: tag + s.Name, Addr: fmt.Sprintf("198.18.0.%d", i+1), Link: s.Link, hub: fmt.Sprintf("h%d", i+1)}
		l.Nodes = append(l.Nodes, n)
		if err := run("ip", "netns", "add", n.NS); err != nil {
			return err
		}
		steps = append(steps,
			[]string{"ip", "-n", l.hub, "link", "add", n.hub, "type", "veth", "peer", "name", "eth0", "netns", n.NS},
			[]string{"ip", "-n", l.hub, "link", "set", n.hub, "master", "br0"},
			[]string{"ip", "-n", l.hub, "link", "set", n.hub, "up"},
			[]string{"ip", "-n", n.NS, "link", "set", "lo", "up"},
			[]string{"ip", "-n", n.NS, "addr", "add", n.Addr + "/24", "dev", "eth0"},
			[]string{"ip", "-n", n.NS, "link", "set", "eth0", "up"},
		)
		if s.Link.UpMbit > 0 {
			steps = append(steps, tbf(n.NS, "eth0", s.Link.UpMbit))
		}
		if s.Link.DownMbit > 0 {
			steps = append(steps, tbf(l.hub, n.hub, s.Link.DownMbit))
		}
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			return fmt.Errorf("wan lab: %w", err)
		}
	}
	return nil
}

// tbf is the command that limits dev's egress in namespace ns to mbit. The bucket holds
// 4 ms at the rate (at least 32 KiB) and the queue 50 ms: one sender cannot burst far past
// the rate, and the queue stays short, like a home router's.
func tbf(ns, dev string, mbit float64) []string {
	burst := max(32<<10, int(mbit*1e6/8*0.004))
	return []string{"tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
		"rate", fmt.Sprintf("%dkbit", int(mbit*1000)), "burst", strconv.Itoa(burst), "latency", "50ms"}
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

// Close ends the processes still running in the lab's namespaces and deletes every
// namespace (the veth pairs and the bridge go with them).
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		var errs []error
		for _, n := range l.Nodes {
			if err := killIn(n.NS); err != nil {
				errs = append(errs, err)
			}
			if err := run("ip", "netns", "del", n.NS); err != nil {
				errs = append(errs, err)
			}
		}
		if err := run("ip", "netns", "del", l.hub); err != nil {
			errs = append(errs, err)
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
