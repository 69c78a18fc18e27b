package node

import (
	"context"

	"go.uber.org/fx"
)

// runInBackground appends a hook that starts run in a goroutine of its own, on a context
// that lives as long as the app (not OnStart's, which ends once start-up is over), and on
// stop cancels that context and waits for run to return; then calls after, if set, and
// hands its error to fx. run reports its own failures: the hook returns fast and cannot.
func runInBackground(lc fx.Lifecycle, run func(ctx context.Context), after func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			go func() {
				defer close(done)
				run(ctx)
			}()
			return nil
		},
		OnStop: func(context.Context) error {
			cancel()
			<-done
			if after != nil {
				return after()
			}
			return nil
		},
	})
}
