package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/internal/testenv"
)

// regressionWorkload is a user's workload in its own package, outside this repository: a
// linear regression on synthetic data it writes itself.
const regressionWorkload = `import numpy as np
import torch
import torch.nn.functional as F

from p2ptrain import Workload
from p2ptrain.workloads.shards import read_npz, shard_name, write_examples, write_npz

TRUE_W = np.linspace(-1.0, 1.0, 8, dtype=np.float32)


def examples(seed, n):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 8), dtype=np.float32)
    y = x @ TRUE_W + np.float32(0.01) * rng.standard_normal(n, dtype=np.float32)
    return x, y.astype(np.float32)


class Regression(Workload):
    def build_model(self):
        return torch.nn.Linear(8, 1)

    def build_optimizer(self, model):
        return torch.optim.SGD(model.parameters(), lr=float(self.config.get("lr", 0.05)))

    def batches(self, shard_paths):
        for p in shard_paths:
            x, y = read_npz(p, "x", "y")
            for lo in range(0, len(y), 16):
                yield torch.from_numpy(x[lo : lo + 16]), torch.from_numpy(y[lo : lo + 16])

    def loss(self, model, batch):
        x, y = batch
        return F.mse_loss(model(x).squeeze(-1), y)

    def evaluate(self, model):
        x, y = examples(999, 256)
        return {"loss": float(F.mse_loss(model(torch.from_numpy(x)).squeeze(-1), torch.from_numpy(y)))}

    @classmethod
    def prepare_dataset(cls, config, out_dir):
        counts = {}
        for i in range(8):
            x, y = examples(i, 64)
            write_npz(f"{out_dir}/{shard_name(i, 'npz')}", x=x, y=y)
            counts[shard_name(i, "npz")] = 64
        write_examples(out_dir, counts)
`

const regressionPyproject = `[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "regression-workload"
version = "1.0"

[tool.setuptools]
packages = ["regression_workload"]
`

// venv creates a virtual environment that sees the system's torch and numpy.
func venv(t *testing.T, dir string) string {
	t.Helper()
	if out, err := exec.Command("/usr/bin/python3", "-c", "import torch, numpy, setuptools, wheel, venv, ensurepip").CombinedOutput(); err != nil {
		testenv.Missing(t, "/usr/bin/python3 lacks torch, numpy, setuptools, wheel or venv (run `make setup`): %v\n%s", err, out)
	}
	v := filepath.Join(dir, "venv")
	run(t, "", "/usr/bin/python3", "-m", "venv", "--system-site-packages", v)
	return v
}

// pipInstall installs a local source tree into the venv with no network: no build
// isolation (the build backend is Debian's setuptools), no dependencies, no index.
func pipInstall(t *testing.T, v, src string) {
	t.Helper()
	run(t, "", filepath.Join(v, "bin", "pip"), "install", "--no-build-isolation", "--no-deps", "--no-index", "--force-reinstall", src)
}

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// copyTree copies pyruntime/python (the source tree a user would pip install) without the
// build directories pip leaves behind, so that parallel runs never share them.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() && (d.Name() == "build" || d.Name() == "__pycache__" || strings.HasSuffix(d.Name(), ".egg-info")) {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestInstalledP2PTrainInAVenv: p2ptrain installed with pip into a venv (offline) runs a
// workload from a package outside this repository through `p2pnode run`, with
// workload.interpreter set to the venv's python and no python_path; and an installed
// p2ptrain that speaks another worker protocol version fails start-up with an error
// naming the installed copy and the fix.
func TestInstalledP2PTrainInAVenv(t *testing.T) {
	dir := t.TempDir()
	v := venv(t, dir)
	src := filepath.Join(dir, "p2ptrain-src")
	copyTree(t, filepath.Join(RepoRoot(), "pyruntime", "python"), src)
	pipInstall(t, v, src)

	work := filepath.Join(dir, "regression-workload")
	if err := os.MkdirAll(filepath.Join(work, "regression_workload"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"pyproject.toml": regressionPyproject, "regression_workload/__init__.py": regressionWorkload,
	} {
		if err := os.WriteFile(filepath.Join(work, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pipInstall(t, v, work)
	site := strings.TrimSpace(run(t, dir, filepath.Join(v, "bin", "python"), "-c", "import p2ptrain, os; print(os.path.dirname(p2ptrain.__file__))"))
	if !strings.HasPrefix(site, v) {
		t.Fatalf("the venv imports p2ptrain from %s, not from its site-packages", site)
	}

	cfg := config.Default()
	cfg.Node.StoreDir = filepath.Join(dir, "store")
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	cfg.Node.HTTP = "127.0.0.1:0"
	cfg.Node.DHT = false
	cfg.Experiment.ID = "venv-regression"
	cfg.Experiment.Roles = []string{config.RoleValidator, config.RoleTrainer}
	cfg.Experiment.Rounds = 4
	cfg.Dataset.Root = filepath.Join(dir, "data")
	cfg.Dataset.Manifest = filepath.Join(dir, "data", "manifest.json")
	cfg.Dataset.Prepare = true
	cfg.Workload.Interpreter = filepath.Join(v, "bin", "python")
	cfg.Workload.Factory = "regression_workload:Regression"
	cfg.Workload.PythonPath = nil
	cfg.Workload.Device = "cpu"
	cfg.Workload.Threads = 1
	cfg.Protocol.InnerSteps = 8
	cfg.Lease.MicroshardsPerTrainer = 2

	p := NewProc(t, dir, "venv", cfg)
	DumpOnFailure(t, p)
	p.Start()
	if err := p.Wait(3 * time.Minute); err != nil {
		t.Fatalf("p2pnode run with the venv's interpreter: %v", err)
	}
	if !strings.Contains(p.Logs(), "installed at "+site) {
		t.Fatalf("the node did not run the installed p2ptrain (%s):\n%s", site, p.Logs())
	}
	first, ok0 := heldOutLossAt(p, 0)
	last, ok4 := heldOutLossAt(p, 4)
	if !ok0 || !ok4 {
		t.Fatalf("no held-out loss printed for round 0 or 4:\n%s", p.Output())
	}
	if last >= first/2 {
		t.Fatalf("held-out loss did not fall: round 0 %.4f, round 4 %.4f", first, last)
	}
	t.Logf("venv %s, p2ptrain at %s: held-out loss %.4f -> %.4f", v, site, first, last)

	// The same venv with a p2ptrain of another worker protocol version: start-up fails,
	// saying which copy and how to fix it.
	worker := filepath.Join(src, "p2ptrain", "worker.py")
	b, err := os.ReadFile(worker)
	if err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(string(b), "PROTOCOL_VERSIONS = (1,)", "PROTOCOL_VERSIONS = (2,)", 1)
	if other == string(b) {
		t.Fatal("worker.py no longer declares PROTOCOL_VERSIONS = (1,); update this test")
	}
	if err := os.WriteFile(worker, []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	pipInstall(t, v, src)
	cfg.Node.StoreDir = filepath.Join(dir, "store2")
	bad := NewProc(t, dir, "mismatch", cfg)
	bad.Start()
	err = bad.Wait(2 * time.Minute)
	if err == nil {
		t.Fatal("a node whose installed p2ptrain speaks protocol 2 started")
	}
	for _, want := range []string{"worker protocol version mismatch", site, "speaks [2]", "p2pnode python-package", "pip uninstall p2ptrain"} {
		if !strings.Contains(bad.Logs(), want) {
			t.Errorf("the start-up error lacks %q:\n%s", want, bad.Logs())
		}
	}
}

// heldOutLossAt is the held-out loss printed on round r's progress line.
func heldOutLossAt(p *Proc, r int) (float64, bool) {
	re := regexp.MustCompile(fmt.Sprintf(`(?m)^round\s+%d(?:/\d+)?\s.*held-out loss\s+([\d.e+-]+)`, r))
	m := re.FindStringSubmatch(p.Output())
	if m == nil {
		return 0, false
	}
	f, err := strconv.ParseFloat(m[1], 64)
	return f, err == nil
}
