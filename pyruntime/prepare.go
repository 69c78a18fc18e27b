package pyruntime

import (
	"context"
	"fmt"
)

// PrepareDataset runs the workload's prepare_dataset (python -m p2ptrain.prepare), which
// writes shard files (and an examples.json sidecar) into outDir. It uses opts' interpreter,
// factory, config, Python path and environment; output goes to opts.Logger. The deadline
// is ctx's, or opts.TrainTimeout.
func PrepareDataset(ctx context.Context, opts Options, outDir string) error {
	what := fmt.Sprintf("pyruntime: prepare dataset (interpreter %s, factory %s) into %s", interpreter(opts), opts.Factory, outDir)
	return runTool(ctx, opts, what, "prepare", "p2ptrain.prepare", "--out", outDir)
}

func interpreter(o Options) string {
	if o.Interpreter == "" {
		return DefaultInterpreter
	}
	return o.Interpreter
}
