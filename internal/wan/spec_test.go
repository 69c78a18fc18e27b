package wan

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseSpec(t *testing.T) {
	good := `
seed: 7
nodes:
  - name: validator
  - name: home-1
    rtt: 100ms
    jitter: 5ms
    loss_pct: 0.5
    up_mbit: 20
    down_mbit: 100
    nat: cone
`
	s, err := ParseSpec([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	want := Spec{Name: "home-1", Link: Link{UpMbit: 20, DownMbit: 100, RTT: 100 * time.Millisecond, Jitter: 5 * time.Millisecond, LossPct: 0.5}, NAT: NATCone}
	if s.Seed != 7 || len(s.Nodes) != 2 || s.Nodes[1] != want {
		t.Fatalf("parsed %+v", s)
	}
	bad := []struct{ name, yaml, field string }{
		{"negative rtt", "nodes: [{name: a, rtt: -5ms}]", "nodes[0] (a).rtt"},
		{"rtt too long", "nodes: [{name: a, rtt: 11s}]", "nodes[0] (a).rtt"},
		{"loss above 100", "nodes: [{name: a}, {name: b, loss_pct: 150}]", "nodes[1] (b).loss_pct"},
		{"loss of 100", "nodes: [{name: a, loss_pct: 100}]", "nodes[0] (a).loss_pct"},
		{"negative loss", "nodes: [{name: a, loss_pct: -1}]", "nodes[0] (a).loss_pct"},
		{"unknown nat", "nodes: [{name: a, nat: carrier}]", "nodes[0] (a).nat"},
		{"jitter beyond the delay", "nodes: [{name: a, rtt: 20ms, jitter: 11ms}]", "nodes[0] (a).jitter"},
		{"queue too long", "nodes: [{name: a, queue: 3s}]", "nodes[0] (a).queue"},
		{"negative rate", "nodes: [{name: a, up_mbit: -1}]", "nodes[0] (a).up_mbit"},
		{"down rate", "nodes: [{name: a, down_mbit: 1e9}]", "nodes[0] (a).down_mbit"},
		{"bad name", "nodes: [{name: A_1}]", "nodes[0] (A_1).name"},
		{"name twice", "nodes: [{name: a}, {name: a}]", "nodes[1] (a).name"},
		{"no nodes", "seed: 1", "nodes: 0"},
		{"unknown field", "nodes: [{name: a, latency: 5ms}]", "latency"},
		{"not a duration", "nodes: [{name: a, rtt: fast}]", "fast"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(c.yaml))
			if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("error %v, want ErrSpec naming %q", err, c.field)
			}
		})
	}
}

func TestDirections(t *testing.T) {
	up, down := Link{RTT: 100 * time.Millisecond, Jitter: 3 * time.Millisecond, LossPct: 2}.directions()
	want := Direction{Delay: 50 * time.Millisecond, Jitter: 3 * time.Millisecond, Loss: 0.02}
	if up != want || down != want {
		t.Fatalf("up %+v down %+v, want %+v each", up, down, want)
	}
}

func FuzzParseSpec(f *testing.F) {
	f.Add([]byte("nodes: [{name: a, rtt: 5ms, nat: cone}]"))
	f.Add([]byte("nodes: [{name: a, loss_pct: 2, jitter: 1ms, rtt: 4ms}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseSpec(data)
		if err != nil {
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("ParseSpec accepted what Validate refuses: %v", err)
		}
		for _, n := range s.Nodes {
			if n.RTT < 0 || n.LossPct < 0 || n.LossPct >= 100 || n.Jitter > n.RTT/2 {
				t.Fatalf("accepted %+v", n)
			}
		}
	})
}

// The specs in configs/wan load.
func TestShippedSpecs(t *testing.T) {
	s, err := LoadSpec("../../configs/wan/home.yaml")
	if err != nil {
		t.Fatal(err)
	}
	nat := map[NAT]int{}
	for _, n := range s.Nodes {
		nat[n.NAT]++
	}
	if len(s.Nodes) != 7 || nat[NATNone] != 3 || nat[NATCone] != 2 || nat[NATSymmetric] != 1 || nat[NATClosed] != 1 {
		t.Fatalf("home.yaml: %d nodes, NAT kinds %v; want a validator and six trainers: two public, two cone, one symmetric, one closed", len(s.Nodes), nat)
	}
	// home-plain.yaml is its baseline: the same nodes and rates, public, no delay or loss.
	plain, err := LoadSpec("../../configs/wan/home-plain.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(plain.Nodes) != len(s.Nodes) {
		t.Fatalf("home-plain.yaml: %d nodes, home.yaml %d", len(plain.Nodes), len(s.Nodes))
	}
	for i, n := range s.Nodes {
		want := Spec{Name: n.Name, Link: Link{UpMbit: n.UpMbit, DownMbit: n.DownMbit, Queue: n.Queue}}
		if plain.Nodes[i] != want {
			t.Errorf("home-plain.yaml node %d: %+v, want home.yaml's rates without delay, loss or NAT: %+v", i, plain.Nodes[i], want)
		}
	}
}
