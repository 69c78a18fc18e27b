package wan

import "fmt"

// natRules is the nftables ruleset of a home router of kind k, whose outside interface is
// wan0: source addresses translated to the router's, and nothing let in from outside that
// is not part of a flow the inside started (conntrack's established state).
func natRules(k NAT) string {
	masq := "masquerade"
	if k == NATSymmetric || k == NATClosed {
		masq = "masquerade fully-random"
	}
	// A TCP simultaneous open (how TCP hole punching gets in) arrives as a bare SYN that
	// conntrack counts as part of the flow the inside started; the closed kind drops it.
	noPunch := ""
	if k == NATClosed {
		noPunch = "\t\tiifname \"wan0\" tcp flags & (syn | ack) == syn drop\n"
	}
	return fmt.Sprintf(`table ip p2pwan_home {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "wan0" %s
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
%s		iifname "wan0" ct state established,related accept
		iifname "wan0" drop
	}
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "wan0" ct state established,related accept
		iifname "wan0" drop
	}
}
`, masq, noPunch)
}
