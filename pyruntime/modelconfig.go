package pyruntime

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// ModelConfig returns the workload's model config (python -m p2ptrain.modelconfig): the
// JSON object its model_config() method returns (the hyperparameters needed to rebuild the
// model), or nil when the workload has no such method. No model is built and no data read.
func ModelConfig(ctx context.Context, opts Options) (json.RawMessage, error) {
	what := fmt.Sprintf("pyruntime: model config (interpreter %s, factory %s)", interpreter(opts), opts.Factory)
	dir, err := os.MkdirTemp("", "p2pnode-modelconfig-*")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "config.json")
	if err := runTool(ctx, opts, what, "modelconfig", "p2ptrain.modelconfig", "--out", out); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: no output: %v", what, ErrCommandFailed, err)
	}
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return nil, nil
	}
	var obj map[string]any
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, fmt.Errorf("%s: %w: output is not a JSON object: %v", what, ErrCommandFailed, err)
	}
	return json.RawMessage(b), nil
}
