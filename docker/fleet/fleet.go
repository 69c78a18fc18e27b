// Package fleet writes the configs of a containerised swarm: the same shape as the local
// demo (demo.WriteConfigs: one validator that is also the bootstrap node, and
// trainers) with container paths and addresses. Every node is configured only by the file
// mounted at /config/<name>.yaml; e2e/compose.yaml runs them.
//
// Inside the containers:
//
//	/config   the directory written here (read-only bind mount)
//	/data     the node's store (a named volume per node)
//	/dataset  the shared dataset (a named volume prepared once by the dataset service,
//	          read-only for the nodes)
package fleet

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/demo"
)

// Container-side constants shared with docker/Dockerfile and e2e/compose*.yaml.
const (
	// UID is the image's non-root user; the validator's key is handed to it.
	UID = 10001
	// P2PPort and HTTPPort are where every node listens inside its container.
	P2PPort  = 4001
	HTTPPort = 8080
	// ValidatorHost is the validator's service name, resolved by the compose network's DNS.
	ValidatorHost = "validator"
	// KeyFile is the validator's identity in the config directory.
	KeyFile = "validator.key"
	// IDFile holds the validator's peer id (for volunteers' bootstrap addresses).
	IDFile = "validator.id"
	// Attacker is the name of the poisoning trainer's config (compose.poison.yaml).
	Attacker = "attacker"
	// Dataset is the name of the one-shot dataset preparation's config.
	Dataset = "dataset"
)

// Options shape a fleet.
type Options struct {
	Dir        string // where the configs go (mounted at /config)
	Trainers   int    // trainer-1 … trainer-N configs (compose.yaml runs 3, compose.scale.yaml 8)
	Rounds     int    // experiment.rounds (0: run until stopped)
	InnerSteps int    // protocol.inner_steps (0: the demo's)
	// RoundTimeout bounds a round whose leased trainer vanished (0: the demo's).
	RoundTimeout time.Duration
	// MinGroup is lease.min_group (0: the demo's 1). With poisoning peers about, 3 or more
	// lets screening compare every update with others.
	MinGroup int
	// MaxNorm is merge.screen.max_norm (0: none), the bound that holds whatever the
	// cohort's size.
	MaxNorm float64
	// Attacker also writes attacker.yaml: one more trainer, for the poisoning overlay.
	Attacker bool
	// Workload is the demo's workload: "digits" (default) or "lm" (see package demo).
	Workload string
	// WorkloadConfig, when set, replaces workload.config (e.g. an lm preset's overrides).
	WorkloadConfig map[string]any
}

// Fleet is what Write produced.
type Fleet struct {
	Dir         string
	ValidatorID string
	Names       []string // validator, trainer-1, …, [attacker]
	Bootstrap   string   // the trainers' bootstrap address, inside the compose network
}

// Write writes Dir/<name>.yaml for every node, Dir/dataset.yaml, the validator's identity
// (Dir/validator.key, owned by the image's user when run as root) and Dir/validator.id.
// An existing validator.key is kept, so rewriting the configs keeps the experiment's
// validator.
func Write(o Options) (*Fleet, error) {
	if o.Trainers < 1 {
		return nil, errors.New("fleet: need at least one trainer")
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// The containers' user must read the directory whatever the caller's umask.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	scratch, err := os.MkdirTemp("", "p2pnode-fleet-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	keyPath := filepath.Join(dir, KeyFile)
	if b, err := os.ReadFile(keyPath); err == nil {
		// demo.WriteConfigs loads the validator's key from <dir>/validator/identity.key.
		if err := os.MkdirAll(filepath.Join(scratch, "validator"), 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(scratch, "validator", "identity.key"), b, 0o600); err != nil {
			return nil, err
		}
	}
	cfgs, err := demo.WriteConfigs(demo.Options{Dir: scratch, Trainers: o.Trainers, Rounds: o.Rounds, Workload: o.Workload,
		Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	key, err := os.ReadFile(filepath.Join(scratch, "validator", "identity.key"))
	if err != nil {
		return nil, err
	}
	vid := cfgs[0].Experiment.Validators[0]
	workload := o.Workload
	if workload == "" {
		workload = demo.WorkloadDigits
	}
	f := &Fleet{Dir: dir, ValidatorID: vid, Names: demo.Names(o.Trainers),
		Bootstrap: fmt.Sprintf("/dns4/%s/tcp/%d/p2p/%s", ValidatorHost, P2PPort, vid)}

	containerise := func(c *config.Config) {
		c.Node.StoreDir = "/data"
		c.Node.Identity = ""
		c.Node.Listen = []string{fmt.Sprintf("/ip4/0.0.0.0/tcp/%d", P2PPort)}
		c.Node.HTTP = fmt.Sprintf("0.0.0.0:%d", HTTPPort)
		c.Dataset.Root = "/dataset/" + workload
		c.Dataset.Manifest = "/dataset/" + workload + "/manifest.json"
		// The dataset service prepares the shared dataset before any node starts; a node
		// that finds no manifest is misconfigured and must say so, not write one.
		c.Dataset.Prepare = false
		if o.InnerSteps > 0 {
			c.Protocol.InnerSteps = o.InnerSteps
		}
		if o.RoundTimeout > 0 {
			c.Lease.RoundTimeout = o.RoundTimeout
		}
		if o.MinGroup > 0 {
			c.Lease.MinGroup = o.MinGroup
		}
		if o.MaxNorm > 0 {
			c.Merge.Screen.MaxNorm = o.MaxNorm
		}
		if o.WorkloadConfig != nil {
			c.Workload.Config = maps.Clone(o.WorkloadConfig)
		}
	}
	for i, c := range cfgs {
		containerise(c)
		if i == 0 {
			c.Node.Identity = "/config/" + KeyFile
		} else {
			c.Node.Bootstrap = []string{f.Bootstrap}
		}
	}
	if o.Attacker {
		a := *cfgs[1]
		f.Names = append(f.Names, Attacker)
		cfgs = append(cfgs, &a)
	}
	// The dataset service runs `p2pnode dataset prepare` with the validator's experiment,
	// writing into the shared volume.
	ds := *cfgs[0]
	ds.Node.StoreDir = "/tmp/prepare"
	ds.Node.Identity = ""
	ds.Dataset.Prepare = true

	write := func(name string, c *config.Config, what string) error {
		b, err := yaml.Marshal(c)
		if err != nil {
			return err
		}
		header := fmt.Sprintf("# Written by docker/fleet: %s of the compose fleet (e2e/compose.yaml).\n"+
			"# Inside its container: store in /data (a volume), dataset in /dataset (shared, read-only).\n", what)
		path := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(path, append([]byte(header), b...), 0o644); err != nil {
			return err
		}
		if _, err := config.Load(path); err != nil {
			return fmt.Errorf("fleet config %s: %w", name, err)
		}
		return nil
	}
	for i, c := range cfgs {
		what := "the validator (and bootstrap node)"
		if i > 0 {
			what = "a trainer"
		}
		if f.Names[i] == Attacker {
			what = "the poisoning trainer (run with --poison: needs an image of the attack build, make image TAGS=attack)"
		}
		if err := write(f.Names[i], c, what); err != nil {
			return nil, err
		}
	}
	if err := write(Dataset, &ds, "the one-shot dataset preparation"); err != nil {
		return nil, err
	}
	if err := writeKey(keyPath, key); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, IDFile), []byte(vid+"\n"), 0o644); err != nil {
		return nil, err
	}
	return f, nil
}

// writeKey writes the validator's key readable only by its owner: the image's user when we
// can hand it over (root), else the caller, with a warning from the node that it is
// readable by others inside the container (the file must be world-readable there).
func writeKey(path string, key []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, key, 0o600); err != nil {
		return err
	}
	if err := os.Chown(tmp, UID, UID); err != nil {
		if err := os.Chmod(tmp, 0o644); err != nil {
			return err
		}
	}
	return os.Rename(tmp, path)
}
