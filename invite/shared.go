package invite

import (
	"bytes"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/p2pnode/p2pnode/config"
)

// shared is the part of a config every node of an experiment runs with. Node-local keys
// (node.*, experiment.roles, dataset.root, the interpreter and device, threads, the
// worker's env and paths, precision, export) stay out: they describe one machine, and
// node.psk and workload.env may hold secrets.
type shared struct {
	Experiment sharedExperiment `yaml:"experiment"`
	Dataset    sharedDataset    `yaml:"dataset"`
	Workload   sharedWorkload   `yaml:"workload"`
	Protocol   config.Protocol  `yaml:"protocol"`
	Merge      config.Merge     `yaml:"merge"`
	Lease      config.Lease     `yaml:"lease"`
}

type sharedExperiment struct {
	Network    string   `yaml:"network"`
	ID         string   `yaml:"id"`
	Validators []string `yaml:"validators"`
	Quorum     int      `yaml:"quorum"`
	Rounds     int      `yaml:"rounds"`
	Seed       int64    `yaml:"seed"`
	EvalEvery  int      `yaml:"eval_every"`
}

type sharedDataset struct {
	Manifest        string `yaml:"manifest"`
	Prepare         bool   `yaml:"prepare"`
	MicroshardBytes int64  `yaml:"microshard_bytes"`
}

type sharedWorkload struct {
	Factory string         `yaml:"factory"`
	Config  map[string]any `yaml:"config"`
	Include []string       `yaml:"include"`
	Exclude []string       `yaml:"exclude"`
	Backend string         `yaml:"backend"`
}

// Experiment returns the shared part of cfg as YAML, with validators listing self when
// the config leaves them out (the node is then the experiment's one validator). The bytes
// are the same for the same config and build, so the experiment's CID is stable across
// restarts of its validators.
func Experiment(cfg *config.Config, self string) ([]byte, error) {
	validators := cfg.Experiment.Validators
	if len(validators) == 0 {
		validators = []string{self}
	}
	manifest := cfg.Dataset.Manifest
	if rel, err := filepath.Rel(cfg.Dataset.Root, manifest); err == nil && !strings.HasPrefix(rel, "..") {
		manifest = rel
	} else {
		manifest = filepath.Base(manifest)
	}
	s := shared{
		Experiment: sharedExperiment{
			Network: cfg.Experiment.Network, ID: cfg.Experiment.ID, Validators: validators, Quorum: cfg.Experiment.Quorum,
			Rounds: cfg.Experiment.Rounds, Seed: cfg.Experiment.Seed, EvalEvery: cfg.Experiment.EvalEvery,
		},
		Dataset:  sharedDataset{Manifest: manifest, Prepare: cfg.Dataset.Prepare, MicroshardBytes: cfg.Dataset.MicroshardBytes},
		Workload: sharedWorkload{Factory: cfg.Workload.Factory, Config: cfg.Workload.Config, Include: cfg.Workload.Include, Exclude: cfg.Workload.Exclude, Backend: cfg.Workload.Backend},
		Protocol: cfg.Protocol,
		Merge:    cfg.Merge,
		Lease:    cfg.Lease,
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&s); err != nil {
		return nil, fmt.Errorf("encode experiment %s: %w", cfg.Experiment.ID, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode experiment %s: %w", cfg.Experiment.ID, err)
	}
	return buf.Bytes(), nil
}

// sharedKeys is every key path the experiment bytes may set ("protocol.diloco.outer_lr"),
// and every section that holds keys ("protocol.diloco").
var sharedKeys = func() map[string]bool {
	out := map[string]bool{}
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		if path != "" {
			out[path] = true
		}
		if t.Kind() != reflect.Struct || t == reflect.TypeOf(time.Duration(0)) {
			return
		}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if name == "" || name == "-" {
				continue
			}
			p := name
			if path != "" {
				p = path + "." + name
			}
			walk(f.Type, p)
		}
	}
	walk(reflect.TypeOf(shared{}), "")
	return out
}()

// checkShared refuses experiment bytes that set a key outside the shared part: a record
// may not point a joining node's store, ports, interpreter or environment anywhere.
func checkShared(n *yaml.Node, path string) error {
	if n.Kind == yaml.DocumentNode {
		for _, c := range n.Content {
			if err := checkShared(c, path); err != nil {
				return err
			}
		}
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return nil
	}
	if path == "workload.config" {
		return nil // the workload's own settings, whatever they are
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		p := n.Content[i].Value
		if path != "" {
			p = path + "." + p
		}
		if !sharedKeys[p] {
			return fmt.Errorf("%w: it sets %s, which is not part of the shared experiment", ErrMalformed, p)
		}
		if err := checkShared(n.Content[i+1], p); err != nil {
			return err
		}
	}
	return nil
}
