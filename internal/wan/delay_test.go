//go:build wan

package wan

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

func newTestLab(t *testing.T, s LabSpec) *Lab {
	t.Helper()
	lab, err := NewLab(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("close the lab: %v", err)
		}
	})
	return lab
}

// startHelper runs the test binary's helper in n's namespace as role and returns its output
// lines; for a server it waits until it listens.
func startHelper(t *testing.T, n *Node, role string, env ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := n.Command(os.Args[0], "-test.run=^TestLabHelper$")
	cmd.Env = append(append(os.Environ(), "WAN_LAB_HELPER="+role), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	if role == "sink" || role == "echo" || role == "listen" || role == "whoami" {
		for sc.Scan() && sc.Text() != "LISTENING" {
		}
	}
	return cmd, sc
}

// line returns the first output line of sc that starts with prefix, split into fields,
// failing the test if none comes within two minutes.
func line(t *testing.T, sc *bufio.Scanner, prefix string) []string {
	t.Helper()
	got := make(chan []string, 1)
	go func() {
		defer close(got)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) > 0 && f[0] == prefix {
				got <- f[1:]
				return
			}
		}
	}()
	select {
	case f, ok := <-got:
		if ok {
			return f
		}
		t.Fatalf("helper ended without a %s line", prefix)
	case <-time.After(2 * time.Minute):
		t.Fatalf("no %s line from the helper in two minutes", prefix)
	}
	return nil
}

// flow sends size bytes over one TCP connection from a to b and returns the receiver's
// rate in Mbit/s over the whole transfer and over its last four fifths.
func flow(t *testing.T, from, to *Node, port, size int, cc string) (total, steady float64) {
	t.Helper()
	addr := fmt.Sprintf("WAN_LAB_ADDR=%s:%d", to.Addr, port)
	sz := fmt.Sprintf("WAN_LAB_SIZE=%d", size)
	_, sink := startHelper(t, to, "sink", addr, sz)
	dial := fmt.Sprintf("WAN_LAB_ADDR=%s:%d", to.Public, port)
	send, _ := startHelper(t, from, "send", dial, sz, "WAN_LAB_CC="+cc)
	f := line(t, sink, "RECEIVED")
	send.Wait()
	var n int
	var secs, last float64
	fmt.Sscan(strings.Join(f, " "), &n, &secs, &last)
	if n != size {
		t.Fatalf("received %d of %d bytes", n, size)
	}
	return float64(n) * 8 / secs / 1e6, float64(n-n/5) * 8 / last / 1e6
}

// A round trip between two nodes takes the sum of their RTTs, within 5 %.
func TestDelayLineRTT(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct{ a, b, want time.Duration }{
		{60 * ms, 40 * ms, 100 * ms},
		{250 * ms, 0, 250 * ms},
		{20 * ms, 0, 20 * ms},
	} {
		t.Run(fmt.Sprint(c.want), func(t *testing.T) {
			lab := newTestLab(t, LabSpec{Nodes: []Spec{{Name: "a", Link: Link{RTT: c.a}}, {Name: "b", Link: Link{RTT: c.b}}}})
			addr := fmt.Sprintf("WAN_LAB_ADDR=%s:5002", lab.Nodes[1].Addr)
			startHelper(t, lab.Nodes[1], "echo", addr)
			_, ping := startHelper(t, lab.Nodes[0], "ping", addr, "WAN_LAB_COUNT=20")
			f := line(t, ping, "RTT")
			var med, lo, hi int64
			fmt.Sscan(strings.Join(f, " "), &med, &lo, &hi)
			got := time.Duration(med) * time.Microsecond
			t.Logf("configured %v: median %v (min %v, max %v) over 20 round trips", c.want, got, time.Duration(lo)*time.Microsecond, time.Duration(hi)*time.Microsecond)
			if d := got - c.want; d < -c.want/20 || d > c.want/20 {
				t.Fatalf("round trip %v, want %v ± 5 %%", got, c.want)
			}
		})
	}
}

// One TCP flow over a 50 Mbit/s link at 100 ms RTT fills at least 90 % of it once slow
// start is over, whether the uplink (tbf) or the downlink (the forwarder's rate) is the
// bottleneck, with Cubic and with BBR (this machine's default, which namespaces inherit).
// With 1 % loss on the link each gets what it gets: logged, not asserted.
func TestDelayLineTCP(t *testing.T) {
	ms := time.Millisecond
	type row struct {
		name     string
		from, to Link
		min      float64 // share of 50 Mbit/s, 0: not asserted
		size     int
	}
	var rows []row
	for _, cc := range []string{"cubic", "bbr"} {
		rows = append(rows,
			row{cc + ", uplink", Link{UpMbit: 50, RTT: 100 * ms}, Link{}, 0.9, 40 << 20},
			row{cc + ", downlink", Link{RTT: 100 * ms}, Link{DownMbit: 50}, 0.9, 80 << 20},
			row{cc + ", uplink, 1 % loss", Link{UpMbit: 50, RTT: 100 * ms, LossPct: 1}, Link{}, 0, 3 << 20},
		)
	}
	for _, c := range rows {
		t.Run(c.name, func(t *testing.T) {
			cc, _, _ := strings.Cut(c.name, ",")
			lab := newTestLab(t, LabSpec{Nodes: []Spec{{Name: "a", Link: c.from}, {Name: "b", Link: c.to}}, Seed: 1})
			total, steady := flow(t, lab.Nodes[0], lab.Nodes[1], 5003, c.size, cc)
			t.Logf("%s: %d MiB at %.1f Mbit/s over the whole flow, %.1f Mbit/s (%.1f %% of 50) after its first fifth; loss drops %d, queue drops %d",
				c.name, c.size>>20, total, steady, steady/50*100, lab.Fwd.Stats("a").Lost.Load()+lab.Fwd.Stats("b").Lost.Load(), lab.Fwd.Stats("b").QueueDrops.Load())
			if c.min > 0 && steady < c.min*50 {
				t.Fatalf("%.1f Mbit/s, want at least %.0f %% of 50", steady, c.min*100)
			}
		})
	}
}

// The forwarder's aggregate throughput over real TUN devices: four TCP flows between four
// pairs of unshaped nodes with no delay, at the same time. Logged as a benchmark row; the
// goal (300 Mbit/s) is not asserted, as it depends on the machine's load.
func TestForwarderThroughput(t *testing.T) {
	var specs []Spec
	for i := range 8 {
		specs = append(specs, Spec{Name: fmt.Sprintf("n%d", i)})
	}
	lab := newTestLab(t, LabSpec{Nodes: specs})
	const size = 64 << 20
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			flow(t, lab.Nodes[2*i], lab.Nodes[2*i+1], 5100+i, size, "")
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("forwarder aggregate: 4 flows × %d MiB in %.2f s = %.0f Mbit/s (load %s)", size>>20, secs, 4*size*8/secs/1e6, strings.Join(strings.Fields(string(load))[:3], " "))
}
