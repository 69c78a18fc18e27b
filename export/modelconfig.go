package export

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/p2pnode/p2pnode/internal/atomicfile"
)

// ConfigFile holds the workload's model hyperparameters beside the safetensors, as the
// transformers convention has it; p2ptrain.sample rebuilds the model from it.
const ConfigFile = "config.json"

// WriteModelConfig writes cfg (a JSON object) to dir/config.json atomically, indented, with
// a final newline. Anything but a JSON object is refused and nothing is written.
func WriteModelConfig(dir string, cfg json.RawMessage) error {
	path := filepath.Join(dir, ConfigFile)
	var obj map[string]any
	if err := json.Unmarshal(cfg, &obj); err != nil || obj == nil {
		return fmt.Errorf("write %s: the workload's model config is not a JSON object", path)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, cfg, "", "  "); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	buf.WriteByte('\n')
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return atomicfile.Write(path, buf.Bytes(), 0o644)
}
