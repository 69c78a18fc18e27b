package export

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/p2pnode/p2pnode/internal/progress"
)

// Defaults, matching the config's export section.
const (
	DefaultShardBytes = 2 << 30
	DefaultBlockBytes = 64 << 10
	MinBlockBytes     = 512
)

// Options configure one export.
type Options struct {
	// InPlace diffs against the model already in the directory (same layout required)
	// and rewrites only the blocks that changed. Without a model there, it writes one.
	InPlace bool
	// ShardBytes: above this many bytes of tensor data the model is split into shards
	// (0: DefaultShardBytes).
	ShardBytes int64
	// BlockBytes is the unit of comparison and rewriting in place (0: DefaultBlockBytes).
	BlockBytes int
	Log        *slog.Logger
	// Progress shows the export as it goes (nil: not shown).
	Progress progress.Tracker

	faults *faults // tests only
}

func (o Options) normalized() (Options, error) {
	if o.ShardBytes == 0 {
		o.ShardBytes = DefaultShardBytes
	}
	if o.BlockBytes == 0 {
		o.BlockBytes = DefaultBlockBytes
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.ShardBytes < 0 {
		return o, fmt.Errorf("export: shard size %d must be positive", o.ShardBytes)
	}
	if o.BlockBytes < MinBlockBytes || o.BlockBytes > MaxBlockBytes {
		return o, fmt.Errorf("export: block size %d outside [%d, %d]", o.BlockBytes, MinBlockBytes, MaxBlockBytes)
	}
	return o, nil
}

// Export writes src as a model in dir (creating it if needed), or with InPlace brings the
// model already there up to date. It first recovers any interrupted export of dir. On
// error the directory holds the model it held before (or, if the error came after the
// journal's commit, the journal that the next export, Recover or VerifyDir finishes).
func Export(ctx context.Context, src *Source, dir string, opts Options) (*Report, error) {
	start := time.Now()
	opts, err := opts.normalized()
	if err != nil {
		return nil, err
	}
	if err := src.check(); err != nil {
		return nil, err
	}
	if err := ensureDir(dir); err != nil {
		return nil, err
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()

	c := newCounter(opts.faults)
	rep := &Report{Dir: dir, Round: src.Meta.Round, BlockBytes: opts.BlockBytes}
	if src.Meta.Head.Defined() {
		rep.Head = src.Meta.Head.String()
	}
	if rep.Recovered, err = recoverLocked(dir, c, opts.Log); err != nil {
		return nil, err
	}
	p, err := makePlan(src, opts.ShardBytes)
	if err != nil {
		return nil, err
	}
	var ex *existingModel
	if opts.InPlace {
		ex, err = readExisting(dir)
		switch {
		case errors.Is(err, ErrNoModel):
			ex = nil // nothing to sync with: write the model whole
		case err != nil:
			return nil, fmt.Errorf("in-place sync of %s: %w", dir, err)
		default:
			if err := ex.checkSameLayout(p); err != nil {
				return nil, fmt.Errorf("in-place sync of %s: %w", dir, err)
			}
		}
	}
	rep.InPlace = ex != nil
	var total uint64
	for i := range p.files {
		total += uint64(p.files[i].size())
	}
	task := progress.Start(opts.Progress, fmt.Sprintf("exporting round %d to %s", src.Meta.Round, dir), progress.InBytes, total, 0)
	t := &txn{dir: dir, src: src, p: p, c: c, opts: opts, a: newApplier(dir, c), task: task}
	err = t.run(ctx, ex, rep)
	task.Finish(err)
	t.cleanup(err)
	if err != nil {
		return nil, fmt.Errorf("export %s to %s: %w", src.describe(), dir, err)
	}
	rep.Written = c.written
	rep.Duration = time.Since(start)
	return rep, nil
}
