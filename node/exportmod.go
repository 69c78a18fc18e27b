package node

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/export"
	"github.com/p2pnode/p2pnode/pyruntime"
)

// exportModule keeps export.dir current while the node runs (export.every_rounds > 0): the
// watcher submits every Nth canonical head and the writer exports it in the background, so
// rounds never wait for the disk. Off, it is absent.
func exportModule(cfg *config.Config) fx.Option {
	if cfg.Export.EveryRounds <= 0 || cfg.Export.Dir == "" {
		return fx.Options()
	}
	return fx.Module("export",
		fx.Provide(fx.Annotate(
			func(arts *artifact.Store, heads *chain.Store, reg prometheus.Registerer, opts Options, log *slog.Logger) (*export.Writer, error) {
				elog := log.With("pkg", "export")
				return export.NewWriter(export.WriterOptions{
					Dir: cfg.Export.Dir,
					Export: export.Options{InPlace: cfg.Export.InPlace, ShardBytes: cfg.Export.ShardBytes,
						BlockBytes: cfg.Export.BlockBytes, Log: elog, Progress: opts.Work},
					Artifacts: arts, Heads: heads, Registerer: reg,
					OnDone: func(r *export.Report, err error) {
						if err != nil {
							elog.Error("export failed", "dir", cfg.Export.Dir, "err", err)
						}
					},
				})
			},
			fx.OnStop(func(ctx context.Context, w *export.Writer) error { return w.Close(ctx) }),
		)),
	)
}

// ModelConfig asks the config's workload for its model config (the JSON object that
// export writes as config.json), through Python; nil when the workload provides none.
func ModelConfig(ctx context.Context, cfg *config.Config, log *slog.Logger) (json.RawMessage, error) {
	return pyruntime.ModelConfig(ctx, runtimeOptions(cfg, log))
}
