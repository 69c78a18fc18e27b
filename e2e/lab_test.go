package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/demo"
	"github.com/p2pnode/p2pnode/internal/wan"
	"github.com/p2pnode/p2pnode/p2p"
)

// newLab builds the lab or fails the test with the reason, and removes it at the end.
func newLab(t *testing.T, s wan.LabSpec) *wan.Lab {
	t.Helper()
	lab, err := wan.NewLab(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("remove the lab: %v", err)
		}
		for _, ns := range wan.Namespaces() {
			if strings.HasPrefix(ns, fmt.Sprintf("%s%d-", wan.NamePrefix, os.Getpid())) {
				t.Errorf("namespace %s left behind", ns)
			}
		}
	})
	return lab
}

// labSwarm is swarmOf with every node in the lab's namespace of its name (the validator
// first, then trainer-1, …): each listens on its lab address, bootstraps from the
// validator's public address and runs wrapped in `ip netns exec`. edit runs after that.
func labSwarm(t *testing.T, lab *wan.Lab, o demo.Options, edit func(name string, c *config.Config)) []*Proc {
	t.Helper()
	vaddr := lab.Nodes[0].Public
	// WAN_AUTONAT=1: the nodes behind routers find out for themselves (AutoNAT), with the
	// lab's outside addresses public to libp2p (p2p.LabAddressesEnv); each node's log then
	// says what it found (p2p.WatchReachability).
	autoNAT := os.Getenv("WAN_AUTONAT") == "1"
	// WAN_QUIC=1: every node listens, and dials the bootstrap validator, over QUIC only.
	transport := "tcp/4001"
	if os.Getenv("WAN_QUIC") == "1" {
		transport = "udp/4001/quic-v1"
	}
	procs := swarmOf(t, o, func(name string, c *config.Config) {
		n := labNode(t, lab, name)
		c.Node.Listen = []string{fmt.Sprintf("/ip4/%s/%s", n.Addr, transport)}
		c.Node.MDNS = false
		// libp2p counts the lab's addresses (198.18.0.0/15) as not public, so AutoNAT
		// never decides: say what each node is, as AutoNAT would on the internet. The
		// bootstrap validator's relay service then starts, and the nodes behind routers
		// reserve slots at it.
		switch {
		case n == lab.Nodes[0]:
			c.Node.Reachability = config.ReachPublic
		case n.NAT != wan.NATNone && !autoNAT:
			c.Node.Reachability = config.ReachPrivate
		}
		for j, b := range c.Node.Bootstrap {
			_, id, _ := strings.Cut(b, "/p2p/")
			c.Node.Bootstrap[j] = fmt.Sprintf("/ip4/%s/%s/p2p/%s", vaddr, transport, id)
		}
		if edit != nil {
			edit(name, c)
		}
	})
	for _, p := range procs {
		p.Wrap = []string{"ip", "netns", "exec", labNode(t, lab, p.Name).NS}
		if autoNAT {
			p.Wrap = append(p.Wrap, "env", p2p.LabAddressesEnv+"=1")
		}
		// WAN_GOLOG: go-libp2p's own log levels in every node (GOLOG_LOG_LEVEL, e.g.
		// "p2p-holepunch=debug,relay=debug"), written to the node's log.
		if g := os.Getenv("WAN_GOLOG"); g != "" {
			p.Wrap = append(p.Wrap, "env", "GOLOG_LOG_LEVEL="+g)
		}
	}
	return procs
}

// labDir is where a lab test's nodes keep their stores: WAN_DIR when set (kept, with the
// nodes' logs beside them once the test ends: keepLogs), else a temporary directory.
func labDir(t *testing.T) string {
	if d := os.Getenv("WAN_DIR"); d != "" {
		return d
	}
	return t.TempDir()
}

// keepLogs writes each node's log to WAN_DIR/<name>.log when the test ends, passed or
// failed; nothing without WAN_DIR.
func keepLogs(t *testing.T, procs []*Proc) {
	dir := os.Getenv("WAN_DIR")
	if dir == "" {
		return
	}
	t.Cleanup(func() {
		for _, p := range procs {
			if err := os.WriteFile(filepath.Join(dir, p.Name+".log"), []byte(p.Logs()), 0o644); err != nil {
				t.Error(err)
			}
		}
	})
}

// labNode is the lab's node of that name.
func labNode(t *testing.T, lab *wan.Lab, name string) *wan.Node {
	t.Helper()
	i := slices.IndexFunc(lab.Nodes, func(n *wan.Node) bool { return n.Name == name })
	if i < 0 {
		t.Fatalf("the lab has no node %s", name)
	}
	return lab.Nodes[i]
}

// envInt is the positive integer in the environment variable name, or def.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
