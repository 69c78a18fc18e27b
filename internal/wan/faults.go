package wan

import (
	"fmt"
	"os/exec"
)

// Faults a volunteer's link meets on the way (issue 46 item 5): the link cut for a while,
// and a home router that forgets its address mappings, as a reboot does.

const cutTable = "p2pwan_cut"

// wanSide is the namespace that holds n's link to the lab and that link's device: the
// router's wan0 behind NAT, the node's own eth0 otherwise.
func (n *Node) wanSide() (ns, dev string) {
	if n.Router != "" {
		return n.Router, "wan0"
	}
	return n.NS, "eth0"
}

// Cut drops every packet on n's link to the lab, both ways, until Restore: a cable pulled,
// a home line down. The node and its home network (its worker on loopback) run on; the
// connections it held see nothing until they time out or the link comes back.
func (n *Node) Cut() error {
	ns, dev := n.wanSide()
	rules := fmt.Sprintf(`table inet %[1]s {
	chain input {
		type filter hook input priority filter - 10; policy accept;
		iifname %[2]q drop
	}
	chain output {
		type filter hook output priority filter - 10; policy accept;
		oifname %[2]q drop
	}
	chain forward {
		type filter hook forward priority filter - 10; policy accept;
		iifname %[2]q drop
		oifname %[2]q drop
	}
}
`, cutTable, dev)
	if err := runIn([]byte(rules), "ip", "netns", "exec", ns, "nft", "-f", "-"); err != nil {
		return fmt.Errorf("cut %s: %w", n.Name, err)
	}
	return nil
}

// Restore ends a Cut.
func (n *Node) Restore() error {
	ns, _ := n.wanSide()
	if err := run("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", cutTable); err != nil {
		return fmt.Errorf("restore %s: %w", n.Name, err)
	}
	return nil
}

// CheckConntrack says whether ForgetMappings can run: it needs the conntrack command
// (Debian's conntrack package).
func CheckConntrack() error {
	if _, err := exec.LookPath("conntrack"); err != nil {
		return fmt.Errorf("%w: no conntrack command (apt-get install conntrack)", ErrUnavailable)
	}
	return nil
}

// ForgetMappings empties the connection tracking table of n's router, as a home router's
// reboot does: every flow the node had open is unknown to its router from then on. What
// the node sends next on those flows is translated anew — behind the symmetric kind to a
// new random port, so its public address changes under its open connections, and the
// other ends no longer recognise them — and what comes in for them is dropped as
// unsolicited. An error for a node that is not behind NAT.
func (n *Node) ForgetMappings() error {
	if n.Router == "" {
		return fmt.Errorf("forget mappings of %s: not behind a router", n.Name)
	}
	if err := CheckConntrack(); err != nil {
		return err
	}
	// conntrack -F exits 0 with "flow entries have been deleted" on stderr.
	if err := run("ip", "netns", "exec", n.Router, "conntrack", "-F"); err != nil {
		return fmt.Errorf("forget mappings of %s: %w", n.Name, err)
	}
	return nil
}
