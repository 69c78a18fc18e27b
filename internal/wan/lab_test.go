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

// A run interrupted before Close removes its namespaces; one killed outright leaves them
// for the next New to remove.
func TestLabRemovedWhenInterrupted(t *testing.T) {
	if os.Getenv("WAN_LAB_CHILD") != "" {
		if _, err := New([]Spec{{Name: "x"}}); err != nil {
			fmt.Println("ERR", err)
			return
		}
		fmt.Println("READY")
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
		for sc.Scan() && sc.Text() != "READY" {
		}
		if got := ours(cmd.Process.Pid); len(got) != 2 {
			t.Fatalf("child's namespaces %v, want 2", got)
		}
		cmd.Process.Signal(sig)
		cmd.Wait()
		if sig == syscall.SIGKILL {
			if len(ours(cmd.Process.Pid)) == 0 {
				t.Fatalf("SIGKILL cannot be caught, yet the namespaces are gone")
			}
			RemoveStale()
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
