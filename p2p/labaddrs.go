package p2p

import (
	"net"
	"os"
	"slices"
	"sync"

	manet "github.com/multiformats/go-multiaddr/net"
)

// LabAddressesEnv, set to 1 in a node's environment, makes the process count the WAN lab's
// outside network (198.18.0.0/16: its routers and public nodes) as public and its home
// networks (198.19.0.0/16) as private, as a router's 203.0.x address and a home's 192.168.x
// would be on the internet (internal/wan). go-multiaddr lists all of 198.18.0.0/15 (the
// benchmarking range the lab draws from) as unroutable, so without it libp2p finds no
// public address in the lab: its hole punching service waits for one for ever and AutoNAT
// never decides. Only the lab's tests set it; it changes go-multiaddr's address classes
// for the whole process, once.
const LabAddressesEnv = "P2PNODE_WAN_LAB_ADDRESSES"

var labClasses sync.Once

// LabAddressClasses applies the lab's address classes (LabAddressesEnv) to this process.
func LabAddressClasses() {
	labClasses.Do(func() {
		_, home, _ := net.ParseCIDR("198.19.0.0/16")
		manet.Unroutable4 = slices.DeleteFunc(slices.Clone(manet.Unroutable4), func(n *net.IPNet) bool { return n.String() == "198.18.0.0/15" })
		manet.Private4 = append(slices.Clone(manet.Private4), home)
	})
}

// labAddressesFromEnv applies the lab's address classes when LabAddressesEnv says so.
func labAddressesFromEnv() {
	if os.Getenv(LabAddressesEnv) == "1" {
		LabAddressClasses()
	}
}
