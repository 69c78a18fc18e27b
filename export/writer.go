package export

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/internal/latest"
)

// ErrClosed is returned by Flush after Close.
var ErrClosed = errors.New("export writer closed")

// WriterOptions configure a background writer.
type WriterOptions struct {
	// Dir is the model directory to keep current (config export.dir).
	Dir string
	// Export holds in_place, shard_bytes and block_bytes from the config, and the logger.
	Export Options
	// Artifacts and Heads resolve SubmitHead; they may be nil if only Submit is used.
	Artifacts *artifact.Store
	Heads     *chain.Store
	// Registerer receives the p2ptrain_export_* metrics (nil: none).
	Registerer prometheus.Registerer
	// OnDone, if set, is called from the writer goroutine after each export.
	OnDone func(*Report, error)
}

// Writer keeps a model directory current from a running node. Submissions never block:
// the writer holds at most one pending snapshot, and a newer one replaces it (latest
// wins), so a slow disk costs exports, never round time or memory.
type Writer struct {
	o   WriterOptions
	log *slog.Logger
	m   *metrics
	w   *latest.Writer[*job, *Report]

	last cid.Cid // head the directory holds after the last successful export; writer goroutine only
}

type job struct {
	head cid.Cid
	src  *Source // nil: open head from the stores when the job runs
}

// NewWriter starts a background writer.
func NewWriter(o WriterOptions) (*Writer, error) {
	if o.Dir == "" {
		return nil, errors.New("export writer: no directory")
	}
	var err error
	if o.Export, err = o.Export.normalized(); err != nil {
		return nil, err
	}
	w := &Writer{o: o, log: o.Export.Log.With("dir", o.Dir), m: newMetrics(o.Registerer)}
	w.w = latest.New(latest.Options[*job, *Report]{
		Write: func(ctx context.Context, j *job) (*Report, error) {
			rep, err := w.export(ctx, j)
			if w.o.OnDone != nil {
				w.o.OnDone(rep, err)
			}
			return rep, err
		},
		Drop: func(j *job, why error) {
			j.src.Close()
			switch {
			case errors.Is(why, latest.ErrSuperseded):
				w.m.superseded.Inc()
			case errors.Is(why, latest.ErrClosed):
			case w.o.OnDone != nil: // left over when Close gave up: a failed export
				w.o.OnDone(nil, why)
			}
		},
		Name: func(j *job) string { return fmt.Sprintf("export head %s", j.head) },
		What: "export",
	})
	return w, nil
}

// SubmitHead asks for head id to be exported from the stores. It returns at once; the
// params artifact is opened when the writer gets to it (it is immutable, so nothing needs
// copying now).
func (w *Writer) SubmitHead(id cid.Cid) { w.submit(&job{head: id}) }

// Submit asks for src to be exported and returns at once. The writer owns src from now on
// and closes it (also when a newer submission supersedes it); the caller must not change
// the bytes behind it.
func (w *Writer) Submit(src *Source) {
	if src == nil {
		w.log.Warn("export: nil source submitted")
		return
	}
	w.submit(&job{head: src.Meta.Head, src: src})
}

func (w *Writer) submit(j *job) {
	if err := w.w.Submit(j); err != nil {
		w.log.Warn("export dropped: writer closed", "head", j.head)
	}
}

// Flush waits until everything submitted before the call is exported or superseded by a
// later export, and returns the last export's error.
func (w *Writer) Flush(ctx context.Context) error {
	err := w.w.Flush(ctx)
	if errors.Is(err, latest.ErrClosed) {
		return ErrClosed
	}
	return err
}

// Close stops accepting submissions and writes the pending one, unless ctx ends first: then
// the export in progress is abandoned (before its commit, so the directory keeps the model
// it had; after it, the journal completes it next time). It returns the last export's error.
func (w *Writer) Close(ctx context.Context) error { return w.w.Close(ctx) }

func (w *Writer) export(ctx context.Context, j *job) (*Report, error) {
	if j.head.Defined() && j.head.Equals(w.last) {
		j.src.Close()
		return nil, nil // the directory already holds this head
	}
	start := time.Now()
	src := j.src
	if src == nil {
		if w.o.Artifacts == nil || w.o.Heads == nil {
			return nil, fmt.Errorf("export head %s: the writer has no stores", j.head)
		}
		var err error
		if src, err = OpenHead(w.o.Artifacts, w.o.Heads, j.head); err != nil {
			w.m.runs.WithLabelValues("error").Inc()
			w.log.Error("background export failed", "head", j.head, "err", err)
			return nil, err
		}
	}
	defer src.Close()
	rep, err := Export(ctx, src, w.o.Dir, w.o.Export)
	if err != nil {
		w.m.runs.WithLabelValues("error").Inc()
		w.log.Error("background export failed", "head", j.head, "round", src.Meta.Round, "err", err)
		return nil, err
	}
	if j.head.Defined() {
		w.last = j.head
	}
	w.m.runs.WithLabelValues("ok").Inc()
	w.m.written.Add(float64(rep.Written))
	w.m.changed.Add(float64(rep.Changed))
	w.m.lastRound.Set(float64(rep.Round))
	w.m.duration.Observe(time.Since(start).Seconds())
	w.log.Info("model exported", "head", j.head, "round", rep.Round, "in_place", rep.InPlace,
		"changed", rep.Changed, "written", rep.Written, "took", rep.Duration.Round(time.Millisecond))
	return rep, nil
}
