package fleet

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/p2p"
)

func TestWriteContainerConfigs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "fleet")
	f, err := Write(Options{Dir: dir, Trainers: 3, Rounds: 7, InnerSteps: 300, RoundTimeout: 20 * time.Second, Attacker: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"validator", "trainer-1", "trainer-2", "trainer-3", Attacker}; !slices.Equal(f.Names, want) {
		t.Fatalf("names %v, want %v", f.Names, want)
	}
	key, err := p2p.LoadIdentity(filepath.Join(dir, KeyFile), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := p2p.PeerID(key); id != f.ValidatorID {
		t.Fatalf("validator.key is %s, configs name %s", id, f.ValidatorID)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, IDFile)); strings.TrimSpace(string(b)) != f.ValidatorID {
		t.Fatalf("validator.id holds %q", b)
	}
	for _, name := range append(slices.Clone(f.Names), Dataset) {
		c, err := config.Load(filepath.Join(dir, name+".yaml"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if c.Experiment.Rounds != 7 || c.Protocol.InnerSteps != 300 || c.Lease.RoundTimeout != 20*time.Second {
			t.Errorf("%s: rounds %d, inner steps %d, round timeout %s", name, c.Experiment.Rounds, c.Protocol.InnerSteps, c.Lease.RoundTimeout)
		}
		if !slices.Equal(c.Experiment.Validators, []string{f.ValidatorID}) || c.Dataset.Root != "/dataset/digits" {
			t.Errorf("%s: validators %v, dataset %s", name, c.Experiment.Validators, c.Dataset.Root)
		}
		switch {
		case name == Dataset:
			if !c.Dataset.Prepare || c.Node.StoreDir == "/data" {
				t.Errorf("dataset: prepare %v, store %s", c.Dataset.Prepare, c.Node.StoreDir)
			}
		case name == "validator":
			if c.Node.Identity != "/config/"+KeyFile || len(c.Node.Bootstrap) != 0 || !c.Experiment.HasRole(config.RoleValidator) {
				t.Errorf("validator: identity %q, bootstrap %v, roles %v", c.Node.Identity, c.Node.Bootstrap, c.Experiment.Roles)
			}
		default:
			if !slices.Equal(c.Node.Bootstrap, []string{"/dns4/validator/tcp/4001/p2p/" + f.ValidatorID}) || !slices.Equal(c.Experiment.Roles, []string{config.RoleTrainer}) {
				t.Errorf("%s: bootstrap %v, roles %v", name, c.Node.Bootstrap, c.Experiment.Roles)
			}
		}
		if name != Dataset && (c.Node.StoreDir != "/data" || c.Node.HTTP != "0.0.0.0:8080" ||
			!slices.Equal(c.Node.Listen, []string{"/ip4/0.0.0.0/tcp/4001"}) || c.Dataset.Prepare) {
			t.Errorf("%s: store %s, http %s, listen %v, prepare %v", name, c.Node.StoreDir, c.Node.HTTP, c.Node.Listen, c.Dataset.Prepare)
		}
	}

	// Rewriting keeps the validator, so a fleet's volumes stay valid.
	again, err := Write(Options{Dir: dir, Trainers: 8})
	if err != nil {
		t.Fatal(err)
	}
	if again.ValidatorID != f.ValidatorID {
		t.Fatalf("rewriting changed the validator from %s to %s", f.ValidatorID, again.ValidatorID)
	}
	if _, err := os.Stat(filepath.Join(dir, "trainer-8.yaml")); err != nil {
		t.Fatal(err)
	}
}
