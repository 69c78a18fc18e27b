package invite

import (
	"fmt"
	"net"
	"sort"
	"strings"

	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// Reach is how far an address can be dialed from.
type Reach int

// From the widest reach to the narrowest.
const (
	ReachPublic   Reach = iota // the internet
	ReachPrivate               // a LAN (RFC 1918, ULA, CGNAT)
	ReachLocal                 // containers on this machine only (docker0 and other bridges)
	ReachLoopback              // this machine only
)

func (r Reach) String() string {
	return [...]string{"the internet", "its private network", "containers on this machine", "this machine only"}[r]
}

// RankedAddr is one address a validator can be joined at.
type RankedAddr struct {
	Addr  string
	Reach Reach
}

// localBridge reports interface names that reach only this machine's containers or VMs.
func localBridge(name string) bool {
	for _, p := range []string{"docker", "br-", "veth", "virbr", "cni", "podman", "lxc", "lxd"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// RankAddrs orders a node's addresses by how widely they can be dialed, widest first
// (public, then private, then container bridges, then loopback), keeping the given order
// within each reach. ifaceOf names the interface an IP belongs to (docker0's addresses are
// private by number but reach only this machine). Unspecified and link-local addresses, and
// those that are not IP, are left out.
func RankAddrs(addrs []string, ifaceOf map[string]string) []RankedAddr {
	var out []RankedAddr
	seen := map[string]bool{}
	for _, s := range addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			continue
		}
		ip, err := manet.ToIP(a)
		if err != nil || ip.IsUnspecified() || ip.IsLinkLocalUnicast() || ip.IsMulticast() {
			continue
		}
		bare, _ := ma.SplitFunc(a, func(c ma.Component) bool { return c.Protocol().Code == ma.P_P2P })
		key := bare.String()
		if seen[key] {
			continue
		}
		seen[key] = true
		r := ReachPublic
		switch {
		case ip.IsLoopback():
			r = ReachLoopback
		case localBridge(ifaceOf[ip.String()]):
			r = ReachLocal
		case manet.IsPrivateAddr(a) || !manet.IsPublicAddr(a):
			r = ReachPrivate
		}
		out = append(out, RankedAddr{Addr: key, Reach: r})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Reach < out[j].Reach })
	return out
}

// InterfaceIPs maps each IP of this machine's interfaces to the interface's name.
func InterfaceIPs() (map[string]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	out := map[string]string{}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				out[n.IP.String()] = ifc.Name
			}
		}
	}
	return out, nil
}

// ListenAddrs expands listen addresses on all interfaces (0.0.0.0, ::) to each interface's
// address, as a node listening there can be reached.
func ListenAddrs(listen []string) ([]string, error) {
	ifaceAddrs, err := manet.InterfaceMultiaddrs()
	if err != nil {
		return nil, fmt.Errorf("list interface addresses: %w", err)
	}
	var out []string
	for _, s := range listen {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("node.listen %q: %w", s, err)
		}
		resolved, err := manet.ResolveUnspecifiedAddress(a, ifaceAddrs)
		if err != nil {
			return nil, fmt.Errorf("node.listen %q: %w", s, err)
		}
		for _, r := range resolved {
			out = append(out, r.String())
		}
	}
	return out, nil
}
