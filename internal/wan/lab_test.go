//go:build wan

package wan

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
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
	if got := ours(os.Getpid()); len(got) != 3 {
		t.Fatalf("namespaces %v, want a, b and the hub", got)
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
		lab, err := New([]Spec{{Name: "x"}})
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
		if got := ours(cmd.Process.Pid); len(got) != 2 {
			t.Fatalf("child's namespaces %v, want 2", got)
		}
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
			RemoveStale()
			requireGone(t, sig, wrapped)
		}
		if got := ours(cmd.Process.Pid); len(got) != 0 {
			t.Fatalf("after %v: %v left behind", sig, got)
		}
	}
}

// TestLabHelper is not a test: the lab tests run the test binary in a namespace with
// WAN_LAB_HELPER=listen (accept one connection, read it to the end) or send.
func TestLabHelper(t *testing.T) {
	addr := os.Getenv("WAN_LAB_ADDR")
	switch os.Getenv("WAN_LAB_HELPER") {
	case "":
		t.Skip("helper process of the lab tests")
	case "listen":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("LISTENING")
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, c)
		fmt.Println("RECEIVED")
	case "send":
		size, _ := strconv.Atoi(os.Getenv("WAN_LAB_SIZE"))
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
}
