package pyruntime

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/p2pnode/p2pnode/pack"
)

// Go and Python agree on packs: Python reads a Go-written pack and recomputes the layout
// hash Go put in its metadata, and Python's writer produces the same bytes as Go's.
func TestPackInteropWithPython(t *testing.T) {
	requireNumpy(t)
	pkg, err := PackageDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	layout := pack.Layout{
		{Name: "a.bias", Shape: []int64{3}},
		{Name: "a.weight", Shape: []int64{3, 2}},
		{Name: "b", Shape: []int64{}},
		{Name: "z.empty", Shape: []int64{0, 4}},
	}
	vals := make([]float32, layout.Params())
	for i := range vals {
		vals[i] = float32(i)*1.25 - 3
	}
	p, err := pack.New(layout, vals, map[string]string{"note": "from go"})
	if err != nil {
		t.Fatal(err)
	}
	goPath := filepath.Join(dir, "go.safetensors")
	if err := p.WriteFile(goPath); err != nil {
		t.Fatal(err)
	}
	pyPath := filepath.Join(dir, "py.safetensors")
	script := `
import sys
from p2ptrain import safetensors as st
p = st.Pack(sys.argv[1])
h = st.layout_hash(p.layout())
assert h == p.metadata["layout_hash"] == p.layout_hash, (h, p.metadata)
st.write_pack(sys.argv[2], [(n, p.array(n)) for n in reversed(p.names())], {"note": "from go"})
print(h)
`
	cmd := exec.Command(testInterpreter(), "-c", script, goPath, pyPath)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pkg)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != layout.Hash() {
		t.Fatalf("python layout hash %s, go %s", got, layout.Hash())
	}
	if !sameFile(t, goPath, pyPath) {
		a, _ := os.ReadFile(goPath)
		b, _ := os.ReadFile(pyPath)
		t.Fatalf("python and go write different bytes:\n%q\n%q", a, b)
	}
	q, err := pack.Load(pyPath)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if !pack.SameLayout(q.Layout, layout) {
		t.Fatal("layout changed")
	}
}
