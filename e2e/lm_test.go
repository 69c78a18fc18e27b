package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/config"
)

// TestLMTinyExportAndSample runs configs/lm-tiny.yaml as shipped but for its paths, its
// round count and a smaller batch, exports the last head with `p2pnode export` and
// generates text from the exported directory with `python3 -m p2ptrain.sample`: config.json
// is written beside the safetensors, and one seed gives one text of the asked length.
func TestLMTinyExportAndSample(t *testing.T) {
	dir := t.TempDir()
	cfg, err := config.Load(filepath.Join(RepoRoot(), "configs", "lm-tiny.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	requirePython(t, cfg.Workload.Interpreter)
	cfg.Node.StoreDir = filepath.Join(dir, "store")
	cfg.Dataset.Root = filepath.Join(dir, "data")
	cfg.Dataset.Manifest = filepath.Join(dir, "data", "manifest.json")
	cfg.Export.Dir = filepath.Join(dir, "model")
	cfg.Experiment.Rounds = 2
	cfg.Workload.Config = map[string]any{"preset": "tiny", "batch_size": 2, "context": 64, "eval_bytes": 4096}
	cfg.Protocol.InnerSteps = 5
	p := NewProc(t, dir, "solo", cfg)
	DumpOnFailure(t, p)
	p.Start()
	if err := p.Wait(5 * time.Minute); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(mustBinary(t), "export", "--config", p.Config, "--log-level", "error").CombinedOutput()
	if err != nil {
		t.Fatalf("export: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "config.json: the model config of workload p2ptrain.workloads.lm:LM") {
		t.Fatalf("export did not report config.json:\n%s", out)
	}
	raw, err := os.ReadFile(filepath.Join(cfg.Export.Dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var mc map[string]any
	if err := json.Unmarshal(raw, &mc); err != nil {
		t.Fatalf("config.json: %v\n%s", err, raw)
	}
	want := map[string]any{"model_type": "p2ptrain-lm", "preset": "tiny", "layers": 5.0, "width": 128.0, "heads": 4.0, "context": 64.0, "vocab_size": 256.0}
	for k, v := range want {
		if mc[k] != v {
			t.Errorf("config.json %s = %v, want %v", k, mc[k], v)
		}
	}
	sample := func(seed string) []byte {
		t.Helper()
		cmd := exec.Command(cfg.Workload.Interpreter, "-m", "p2ptrain.sample", "--model", cfg.Export.Dir,
			"--prompt", "def ", "--tokens", "48", "--seed", seed)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(RepoRoot(), "pyruntime", "python"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("sample --seed %s: %v\n%s", seed, err, stderr.String())
		}
		return b
	}
	a, b := sample("3"), sample("3")
	if !bytes.Equal(a, b) {
		t.Fatalf("one seed, two texts:\n%q\n%q", a, b)
	}
	if len(a) != len("def ")+48+1 || !bytes.HasPrefix(a, []byte("def ")) {
		t.Fatalf("sample printed %d bytes, want the prompt, 48 bytes and a newline: %q", len(a), a)
	}
	t.Logf("sample: %q", a)
}
