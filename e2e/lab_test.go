package e2e

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/demo"
	"github.com/p2pnode/p2pnode/internal/wan"
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
	procs := swarmOf(t, o, func(name string, c *config.Config) {
		c.Node.Listen = []string{fmt.Sprintf("/ip4/%s/tcp/4001", labNode(t, lab, name).Addr)}
		c.Node.MDNS = false
		for j, b := range c.Node.Bootstrap {
			_, id, _ := strings.Cut(b, "/p2p/")
			c.Node.Bootstrap[j] = fmt.Sprintf("/ip4/%s/tcp/4001/p2p/%s", vaddr, id)
		}
		if edit != nil {
			edit(name, c)
		}
	})
	for _, p := range procs {
		p.Wrap = []string{"ip", "netns", "exec", labNode(t, lab, p.Name).NS}
	}
	return procs
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
