//go:build wan

package wan

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func ours(pid int) []string {
	var out []string
	for _, ns := range Namespaces() {
		if strings.HasPrefix(ns, fmt.Sprintf("%s%d-", NamePrefix, pid)) {
			out = append(out, ns)
		}
	}
	return out
}

// The lab makes one namespace per node plus the hub, addresses them from 198.18.0.0/15,
// shapes the links it was asked to, counts bytes, and removes everything on Close.
func TestLabBuildsAndRemovesItself(t *testing.T) {
	lab, err := New([]Spec{{Name: "a", Link: Link{UpMbit: 20, DownMbit: 100}}, {Name: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()
	if got := ours(os.Getpid()); len(got) != 2 {
		t.Fatalf("namespaces %v, want a and b", got)
	}
	if lab.Nodes[0].Addr != "198.18.0.1" || lab.Nodes[1].Addr != "198.18.0.2" {
		t.Fatalf("addresses %s %s", lab.Nodes[0].Addr, lab.Nodes[1].Addr)
	}
	qd, err := exec.Command("tc", "-n", lab.Nodes[0].NS, "qdisc", "show", "dev", "eth0").Output()
	if err != nil || !strings.Contains(string(qd), "tbf") || !strings.Contains(string(qd), "20Mbit") {
		t.Fatalf("node a's uplink is not shaped: %s %v", qd, err)
	}
	if qd, _ := exec.Command("tc", "-n", lab.Nodes[1].NS, "qdisc", "show", "dev", "eth0").Output(); strings.Contains(string(qd), "tbf") {
		t.Fatalf("node b was not to be shaped: %s", qd)
	}
	// 4 MB from a to b over a's 20 Mbit/s uplink: every byte shows on a's counters, and the
	// transfer cannot beat the rate (tbf holds it; a lower bound would only time the CPU).
	const size = 4 << 20
	srv := lab.Nodes[1].Command(os.Args[0], "-test.run=^TestLabHelper$")
	srv.Env = append(os.Environ(), "WAN_LAB_HELPER=listen", "WAN_LAB_ADDR="+lab.Nodes[1].Addr+":5001")
	srvOut, _ := srv.StdoutPipe()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()
	sc := bufio.NewScanner(srvOut)
	for sc.Scan() && sc.Text() != "LISTENING" {
	}
	before, err := lab.Nodes[0].Counters()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cli := lab.Nodes[0].Command(os.Args[0], "-test.run=^TestLabHelper$")
	cli.Env = append(os.Environ(), "WAN_LAB_HELPER=send", "WAN_LAB_ADDR="+lab.Nodes[1].Addr+":5001", fmt.Sprintf("WAN_LAB_SIZE=%d", size))
	if out, err := cli.CombinedOutput(); err != nil {
		t.Fatalf("send: %v\n%s", err, out)
	}
	for sc.Scan() && sc.Text() != "RECEIVED" {
	}
	secs := time.Since(start).Seconds()
	after, err := lab.Nodes[0].Counters()
	if err != nil {
		t.Fatal(err)
	}
	d := after.Sub(before)
	if d.TxBytes < size || d.RxBytes == 0 {
		t.Fatalf("sent %d bytes, a's wire shows %+v", size, d)
	}
	if mbit := float64(size) * 8 / secs / 1e6; mbit > 22 {
		t.Fatalf("%.1f Mbit/s over a link shaped to 20", mbit)
	}
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
	if got := ours(os.Getpid()); len(got) != 0 {
		t.Fatalf("left behind: %v", got)
	}
}

// running reports whether process pid runs (a zombie waiting for its reaper does not).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// requireGone waits up to 5 s for process pid to end.
func requireGone(t *testing.T, sig syscall.Signal, pid int) {
	t.Helper()
	for range 100 {
		if !running(pid) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	t.Fatalf("after %v: process %d in the lab still runs", sig, pid)
}

// A run interrupted before Close removes its namespaces and ends the processes it started
// in them; one killed outright leaves the namespaces for the next New to remove, and its
// processes die with it.
func TestLabRemovedWhenInterrupted(t *testing.T) {
	if os.Getenv("WAN_LAB_CHILD") != "" {
		lab, err := New([]Spec{{Name: "x"}, {Name: "y", NAT: NATCone}})
		if err != nil {
			fmt.Println("ERR", err)
			return
		}
		// One process started with Command, one as the e2e harness starts nodes (ip netns
		// exec, without Command's parent-death signal).
		sleeper := lab.Nodes[0].Command("sleep", "60")
		wrapped := exec.Command("ip", "netns", "exec", lab.Nodes[0].NS, "sleep", "60")
		for _, c := range []*exec.Cmd{sleeper, wrapped} {
			if err := c.Start(); err != nil {
				fmt.Println("ERR", err)
				return
			}
		}
		fmt.Println("READY", sleeper.Process.Pid, wrapped.Process.Pid)
		time.Sleep(time.Minute)
		return
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLabRemovedWhenInterrupted$")
		cmd.Env = append(os.Environ(), "WAN_LAB_CHILD=1")
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		var sleeper, wrapped int
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "READY" {
				sleeper, _ = strconv.Atoi(f[1])
				wrapped, _ = strconv.Atoi(f[2])
				break
			}
		}
		if sleeper == 0 || wrapped == 0 {
			t.Fatal("child did not start its lab and the processes in it")
		}
		if got := ours(cmd.Process.Pid); len(got) != 3 {
			t.Fatalf("child's namespaces %v, want x, y and y's router", got)
		}
		xNS := fmt.Sprintf("%s%d-x", NamePrefix, cmd.Process.Pid)
		cmd.Process.Signal(sig)
		cmd.Wait()
		// The processes the child started in its namespace are gone: on SIGTERM both, ended
		// by Close; on SIGKILL the one started with Command at once (its parent-death
		// signal), the other when the next run removes the stale namespace.
		requireGone(t, sig, sleeper)
		if sig == syscall.SIGTERM {
			requireGone(t, sig, wrapped)
		}
		if sig == syscall.SIGKILL {
			if len(ours(cmd.Process.Pid)) == 0 {
				t.Fatalf("SIGKILL cannot be caught, yet the namespaces are gone")
			}
			// The TUN device died with the process that held it.
			for range 100 {
				if exec.Command("ip", "-n", xNS, "link", "show", "dev", "eth0").Run() != nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if out, err := exec.Command("ip", "-n", xNS, "link", "show", "dev", "eth0").CombinedOutput(); err == nil {
				t.Fatalf("x's TUN device outlived its process: %s", out)
			}
			RemoveStale()
			requireGone(t, sig, wrapped)
		}
		if got := ours(cmd.Process.Pid); len(got) != 0 {
			t.Fatalf("after %v: %v left behind", sig, got)
		}
	}
}

// TestLabHelper is not a test: the lab tests run the test binary in a namespace with
// WAN_LAB_HELPER set to what it should do there: listen (accept one connection, read it to
// the end), send (WAN_LAB_SIZE bytes), sink (like listen, then print the bytes' timing),
// echo (send back every 8-byte message) or ping (WAN_LAB_COUNT round trips of 8 bytes, then
// print their median).
func TestLabHelper(t *testing.T) {
	addr := os.Getenv("WAN_LAB_ADDR")
	size, _ := strconv.Atoi(os.Getenv("WAN_LAB_SIZE"))
	switch os.Getenv("WAN_LAB_HELPER") {
	case "":
		t.Skip("helper process of the lab tests")
	case "listen", "sink", "echo", "whoami":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("LISTENING")
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		switch os.Getenv("WAN_LAB_HELPER") {
		case "listen":
			io.Copy(io.Discard, c)
			fmt.Println("RECEIVED")
		case "echo":
			io.Copy(c, c)
		case "whoami":
			fmt.Println("PEER", c.RemoteAddr())
			c.Close()
		case "sink":
			// The total, and the time to the first fifth: the rate over the other four fifths
			// is the flow's once slow start is over.
			buf := make([]byte, 1<<16)
			var n int
			var start, fifth time.Time
			for {
				k, err := c.Read(buf)
				if n == 0 && k > 0 {
					start = time.Now()
				}
				n += k
				if fifth.IsZero() && n >= size/5 {
					fifth = time.Now()
				}
				if err != nil {
					break
				}
			}
			end := time.Now()
			fmt.Printf("RECEIVED %d %.6f %.6f\n", n, end.Sub(start).Seconds(), end.Sub(fifth).Seconds())
		}
	case "send":
		// WAN_LAB_CC picks the flow's congestion control (the namespace's default otherwise).
		// WAN_LAB_LPORT binds the connection's local port.
		d := net.Dialer{Timeout: 3 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
			cc := os.Getenv("WAN_LAB_CC")
			if cc == "" {
				return nil
			}
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptString(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CONGESTION, cc)
			}); err != nil {
				return err
			}
			return serr
		}}
		if lp, err := strconv.Atoi(os.Getenv("WAN_LAB_LPORT")); err == nil {
			d.LocalAddr = &net.TCPAddr{Port: lp}
		}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			fmt.Println("DIALFAILED", err)
			t.Fatal(err)
		}
		if _, err := c.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		c.Close()
	case "ping":
		count, _ := strconv.Atoi(os.Getenv("WAN_LAB_COUNT"))
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		var rtts []time.Duration
		msg := make([]byte, 8)
		for range count {
			start := time.Now()
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, msg); err != nil {
				t.Fatal(err)
			}
			rtts = append(rtts, time.Since(start))
		}
		slices.Sort(rtts)
		fmt.Printf("RTT %d %d %d\n", rtts[len(rtts)/2].Microseconds(), rtts[0].Microseconds(), rtts[len(rtts)-1].Microseconds())
	}
}
