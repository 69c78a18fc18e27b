package pyruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// PrepareDataset runs the workload's prepare_dataset (python -m p2ptrain.prepare), which
// writes shard files (and an examples.json sidecar) into outDir. It uses opts' interpreter,
// factory, config, Python path and environment; output goes to opts.Logger. The deadline
// is ctx's, or opts.TrainTimeout.
func PrepareDataset(ctx context.Context, opts Options, outDir string) error {
	o, err := opts.withDefaults()
	if err != nil {
		return err
	}
	what := fmt.Sprintf("pyruntime: prepare dataset (interpreter %s, factory %s) into %s", o.Interpreter, o.Factory, outDir)
	if err := checkFactory(o.Factory); err != nil {
		return fmt.Errorf("%s: option Factory: %w", what, err)
	}
	src, err := resolvePackage(ctx, o)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	pkgDir := src.Dir
	cfg, err := json.Marshal(o.Config)
	if err != nil {
		return fmt.Errorf("%s: config: %w", what, err)
	}
	args := []string{"-u", "-m", "p2ptrain.prepare", "--factory", o.Factory, "--config", string(cfg), "--out", outDir}
	ch, err := startChild(o.Interpreter, args, o.pythonEnv(pkgDir, nil), nil, o.Logger.With("task", "prepare"))
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	timer := time.NewTimer(o.TrainTimeout)
	defer timer.Stop()
	select {
	case <-ch.done:
	case <-timer.C:
		ch.killAndWait(5 * time.Second)
		return fmt.Errorf("%s: %w after %s; %s", what, ErrTimeout, o.TrainTimeout, formatTail(ch.stderrTail(8, 200*time.Millisecond)))
	case <-ctx.Done():
		ch.killAndWait(5 * time.Second)
		err := ctx.Err()
		if errors.Is(err, context.DeadlineExceeded) {
			err = errors.Join(ErrTimeout, err)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	if ch.err != nil {
		return fmt.Errorf("%s: %w: %s; %s", what, ErrCommandFailed, ch.exitString(), formatTail(ch.stderrTail(8, time.Second)))
	}
	return nil
}
