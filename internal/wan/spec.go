package wan

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"time"

	"gopkg.in/yaml.v3"
)

// Link is one node's connection to the rest of the lab. Rates are in Mbit/s (0: unshaped).
// RTT is the round trip between the node and the lab's core, so two nodes are RTT_a + RTT_b
// apart; each direction of the link delays by RTT/2 ± Jitter and drops LossPct percent of
// its packets at random. Queue is how long a packet may wait for either rate before it is
// dropped (DefaultQueue if 0).
type Link struct {
	UpMbit   float64       `yaml:"up_mbit"`
	DownMbit float64       `yaml:"down_mbit"`
	RTT      time.Duration `yaml:"rtt"`
	Jitter   time.Duration `yaml:"jitter"`
	LossPct  float64       `yaml:"loss_pct"`
	Queue    time.Duration `yaml:"queue"`
}

// NAT is the kind of home router in front of a node.
type NAT string

const (
	// NATNone: the node holds its public address itself.
	NATNone NAT = ""
	// NATCone: Linux masquerade, source ports kept where free (an endpoint-independent
	// mapping); nothing comes in that the inside did not send out first.
	NATCone NAT = "cone"
	// NATSymmetric: masquerade with fully-random source ports, a new port per destination.
	NATSymmetric NAT = "symmetric"
	// NATClosed: symmetric ports, and no connection the outside opens gets in, not even by
	// a simultaneous open (inbound TCP SYNs are dropped): only what the node dials works.
	NATClosed NAT = "closed"
)

// Spec names a node, its link and its router.
type Spec struct {
	Name string `yaml:"name"`
	Link `yaml:",inline"`
	NAT  NAT `yaml:"nat"`
}

// LabSpec is a lab as a file describes it (configs/wan/*.yaml).
type LabSpec struct {
	Nodes []Spec `yaml:"nodes"`
	// Seed makes the jitter and loss draws reproducible (0 is a seed like any other).
	Seed uint64 `yaml:"seed"`
}

// ErrSpec: a lab spec that cannot be built; the message names the field.
var ErrSpec = errors.New("wan lab spec")

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,30}$`)

// Limits a spec is checked against.
const (
	maxRTT   = 10 * time.Second
	maxMbit  = 100_000
	maxQueue = 2 * time.Second
)

// Validate refuses a spec that cannot be built or makes no sense, naming the node and field.
func (s LabSpec) Validate() error { return validate(s.Nodes) }

func validate(nodes []Spec) error {
	if len(nodes) == 0 || len(nodes) > 250 {
		return fmt.Errorf("%w: nodes: %d, want 1 to 250", ErrSpec, len(nodes))
	}
	seen := map[string]bool{}
	for i, n := range nodes {
		field := func(f string) string { return fmt.Sprintf("nodes[%d] (%s).%s", i, n.Name, f) }
		switch {
		case !nameRE.MatchString(n.Name):
			return fmt.Errorf("%w: %s: %q, want 1 to 31 of a-z, 0-9 and -, starting with a letter or digit", ErrSpec, field("name"), n.Name)
		case seen[n.Name]:
			return fmt.Errorf("%w: %s: %q is used twice", ErrSpec, field("name"), n.Name)
		case n.UpMbit < 0 || n.UpMbit > maxMbit:
			return fmt.Errorf("%w: %s: %g, want 0 (unshaped) to %d", ErrSpec, field("up_mbit"), n.UpMbit, maxMbit)
		case n.DownMbit < 0 || n.DownMbit > maxMbit:
			return fmt.Errorf("%w: %s: %g, want 0 (unshaped) to %d", ErrSpec, field("down_mbit"), n.DownMbit, maxMbit)
		case n.RTT < 0 || n.RTT > maxRTT:
			return fmt.Errorf("%w: %s: %v, want 0 to %v", ErrSpec, field("rtt"), n.RTT, maxRTT)
		case n.Jitter < 0 || n.Jitter > n.RTT/2:
			return fmt.Errorf("%w: %s: %v, want 0 to half the rtt (%v): each direction's delay is rtt/2 ± jitter", ErrSpec, field("jitter"), n.Jitter, n.RTT/2)
		case n.Queue < 0 || n.Queue > maxQueue:
			return fmt.Errorf("%w: %s: %v, want 0 (the default, %v) to %v", ErrSpec, field("queue"), n.Queue, DefaultQueue, maxQueue)
		case !(n.LossPct >= 0 && n.LossPct < 100):
			return fmt.Errorf("%w: %s: %g %%, want 0 to below 100", ErrSpec, field("loss_pct"), n.LossPct)
		}
		switch n.NAT {
		case NATNone, NATCone, NATSymmetric, NATClosed:
		default:
			return fmt.Errorf("%w: %s: %q, want none (empty), %s, %s or %s", ErrSpec, field("nat"), n.NAT, NATCone, NATSymmetric, NATClosed)
		}
		seen[n.Name] = true
	}
	return nil
}

// ParseSpec decodes and checks a lab spec; unknown fields are refused.
func ParseSpec(data []byte) (LabSpec, error) {
	var s LabSpec
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return LabSpec{}, fmt.Errorf("%w: %w", ErrSpec, err)
	}
	if err := s.Validate(); err != nil {
		return LabSpec{}, err
	}
	return s, nil
}

// LoadSpec reads a lab spec file.
func LoadSpec(path string) (LabSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return LabSpec{}, fmt.Errorf("%w: %w", ErrSpec, err)
	}
	s, err := ParseSpec(data)
	if err != nil {
		return LabSpec{}, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// directions returns what the link does to packets the node sends and receives.
func (l Link) directions() (up, down Direction) {
	d := Direction{Delay: l.RTT / 2, Jitter: l.Jitter, Loss: l.LossPct / 100}
	return d, d
}

// queue returns the link's queue, the default if unset.
func (l Link) queue() time.Duration {
	if l.Queue > 0 {
		return l.Queue
	}
	return DefaultQueue
}

// port returns the forwarder's configuration for the link.
func (l Link) port(seed uint64) PortConfig {
	up, down := l.directions()
	return PortConfig{Up: up, Down: down, DownMbit: l.DownMbit, Queue: l.queue(), Seed: seed}
}
