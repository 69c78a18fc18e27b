//go:build wan

package wan

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Behind each kind of home router a node reaches a public node, which sees the router's
// address (with the node's own source port behind a cone NAT, another behind the others),
// and nothing the public node dials reaches the node behind the router.
func TestNATKinds(t *testing.T) {
	if err := CheckNAT(); err != nil {
		t.Fatal(err)
	}
	for _, k := range []NAT{NATCone, NATSymmetric, NATClosed} {
		t.Run(string(k), func(t *testing.T) {
			lab := newTestLab(t, LabSpec{Nodes: []Spec{{Name: "pub", Link: Link{RTT: 10 * time.Millisecond}}, {Name: "home", NAT: k}}})
			pub, home := lab.Nodes[0], lab.Nodes[1]
			if home.Addr == home.Public || home.Router == "" {
				t.Fatalf("home node at %s, public %s, router %q: not behind a router", home.Addr, home.Public, home.Router)
			}
			// Out: the public node sees the router's address.
			kept := 0
			for i := range 3 {
				lport := 41000 + i
				_, who := startHelper(t, pub, "whoami", fmt.Sprintf("WAN_LAB_ADDR=%s:%d", pub.Addr, 5200+i))
				send, sout := startHelper(t, home, "send", fmt.Sprintf("WAN_LAB_ADDR=%s:%d", pub.Public, 5200+i), "WAN_LAB_SIZE=1", fmt.Sprintf("WAN_LAB_LPORT=%d", lport))
				var said []string
				for sout.Scan() {
					said = append(said, sout.Text())
				}
				if err := send.Wait(); err != nil {
					t.Fatalf("connection %d out from behind the router: %v: %s", i, err, strings.Join(said, "\n"))
				}
				f := line(t, who, "PEER")
				host, port, _ := net.SplitHostPort(f[0])
				if host != home.Public {
					t.Fatalf("the public node saw %s, want the router's %s", f[0], home.Public)
				}
				if p, _ := strconv.Atoi(port); p == lport {
					kept++
				} else if k == NATCone {
					t.Fatalf("cone NAT changed source port %d to %d", lport, p)
				}
			}
			if k != NATCone && kept == 3 {
				t.Fatalf("%s NAT kept the source port of three connections out of three", k)
			}
			// In: a connection from outside to the router's address does not get through.
			startHelper(t, home, "listen", fmt.Sprintf("WAN_LAB_ADDR=%s:5300", home.Addr))
			send, out := startHelper(t, pub, "send", fmt.Sprintf("WAN_LAB_ADDR=%s:5300", home.Public), "WAN_LAB_SIZE=1")
			f := line(t, out, "DIALFAILED")
			send.Wait()
			t.Logf("%s: dialing in: %s", k, strings.Join(f, " "))
		})
	}
}
