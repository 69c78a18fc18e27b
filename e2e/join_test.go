package e2e

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/config"
)

// TestVolunteerJoinsWithOneCommand is the owner's and the volunteer's whole path as real
// processes: `init --owner`, `run`, `invite`, then `join` with the line invite printed, until
// a head merges the volunteer's contribution beside the owner's.
func TestVolunteerJoinsWithOneCommand(t *testing.T) {
	requirePython(t, config.Default().Workload.Interpreter)
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	ownerDir, volDir := filepath.Join(root, "owner"), filepath.Join(root, "volunteer")
	port := freePort(t)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("p2pnode %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	t.Logf("%s", run("init", "--owner", "--dir", ownerDir, "--port", port))
	cfgPath := filepath.Join(ownerDir, "p2pnode.yaml")
	// Train until stopped, so the volunteer joins a live experiment however slow the machine.
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, []byte(strings.Replace(string(b), "\n  rounds: 100\n", "\n  rounds: 0\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	owner := &Proc{t: t, Name: "owner", Dir: ownerDir, Config: cfgPath}
	vol := &Proc{t: t, Name: "volunteer", Dir: root, Config: filepath.Join(volDir, "p2pnode.yaml")}
	DumpOnFailure(t, owner, vol)
	owner.Start()
	Eventually(t, 3*time.Minute, "the owner's round 2", func() bool { r := owner.Rounds(); return len(r) > 0 && r[len(r)-1] >= 2 })

	inv := run("invite", "--config", cfgPath)
	t.Logf("invite:\n%s", inv)
	m := regexp.MustCompile(`p2pnode join (\S+)`).FindStringSubmatch(inv)
	if m == nil {
		t.Fatalf("invite printed no join line:\n%s", inv)
	}
	vol.Command = []string{"join", "--dir", volDir, m[1]}
	start := time.Now()
	vol.Start()
	Eventually(t, 4*time.Minute, "a head merging the volunteer's contribution", func() bool {
		return regexp.MustCompile(`(?m)^round .* merged 2 `).MatchString(owner.Output())
	})
	t.Logf("volunteer merged %.1f s after `join` started", time.Since(start).Seconds())
	out := vol.Output()
	for _, want := range []string{"experiment  p2ptrain/digits", "signed by validator", "wrote " + vol.Config, "dashboard   http://"} {
		if !strings.Contains(out, want) {
			t.Errorf("join did not print %q:\n%s", want, out)
		}
	}
	if _, err := config.Load(vol.Config); err != nil {
		t.Errorf("the volunteer's config does not load: %v", err)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}
