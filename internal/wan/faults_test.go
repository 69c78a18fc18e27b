//go:build wan

package wan

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// A cut link carries nothing either way until it is restored, for a public node and for
// one behind a router; forgetting a router's mappings empties its connection tracking
// table, and a node not behind NAT has none to forget.
func TestFaults(t *testing.T) {
	if err := CheckNAT(); err != nil {
		t.Fatal(err)
	}
	if err := CheckConntrack(); err != nil {
		t.Fatal(err)
	}
	lab := newTestLab(t, LabSpec{Nodes: []Spec{{Name: "pub"}, {Name: "other"}, {Name: "home", NAT: NATSymmetric}}})
	pub, other, home := lab.Nodes[0], lab.Nodes[1], lab.Nodes[2]
	port := 5400
	// reaches says whether from can open a connection to pub, to a listener of its own (the
	// send helper gives up after 3 s).
	reaches := func(from *Node) bool {
		port++
		startHelper(t, pub, "listen", fmt.Sprintf("WAN_LAB_ADDR=%s:%d", pub.Addr, port))
		send, _ := startHelper(t, from, "send", fmt.Sprintf("WAN_LAB_ADDR=%s:%d", pub.Public, port), "WAN_LAB_SIZE=1")
		return send.Wait() == nil
	}
	for _, n := range []*Node{home, other} {
		t.Run(n.Name, func(t *testing.T) {
			if !reaches(n) {
				t.Fatalf("%s cannot reach %s before the cut", n.Name, pub.Name)
			}
			if err := n.Cut(); err != nil {
				t.Fatal(err)
			}
			if reaches(n) {
				t.Fatalf("%s reached %s through a cut link", n.Name, pub.Name)
			}
			if err := n.Restore(); err != nil {
				t.Fatal(err)
			}
			if !reaches(n) {
				t.Fatalf("%s cannot reach %s after the link was restored", n.Name, pub.Name)
			}
		})
	}
	flows := func() string {
		out, err := exec.Command("ip", "netns", "exec", home.Router, "conntrack", "-C").Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	if n := flows(); n == "0" {
		t.Fatal("the router tracks no flow after the home node's connections")
	}
	if err := home.ForgetMappings(); err != nil {
		t.Fatal(err)
	}
	if n := flows(); n != "0" {
		t.Fatalf("the router still tracks %s flows after forgetting its mappings", n)
	}
	if err := other.ForgetMappings(); err == nil {
		t.Fatal("a public node's mappings forgotten without an error")
	}
}
