package pyruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// runTool runs `interpreter -u -m module --factory F --config JSON args...` (one of the
// p2ptrain command-line tools) to completion under ctx and opts.TrainTimeout. what names
// the operation in errors; the tool's output goes to opts.Logger with task=task.
func runTool(ctx context.Context, opts Options, what, task, module string, args ...string) error {
	o, err := opts.withDefaults()
	if err != nil {
		return err
	}
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
	argv := append([]string{"-u", "-m", module, "--factory", o.Factory, "--config", string(cfg)}, args...)
	ch, err := startChild(o.Interpreter, argv, o.pythonEnv(pkgDir, nil), nil, o.Logger.With("task", task))
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
