package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/dataset"
	"github.com/p2pnode/p2pnode/internal/progress"
	"github.com/p2pnode/p2pnode/pyruntime"
)

// dataState is the experiment's dataset as this node sees it: the manifest, the plan the
// ledger counts in, and the shard store trainers read microshards from.
type dataState struct {
	manifest *dataset.Manifest
	plan     *dataset.Plan
	planID   string
	shards   *dataset.ShardStore
}

// Paths resolves microshard indices of the plan to verified local files.
func (d *dataState) Paths(ctx context.Context, microshards []uint32) ([]string, error) {
	return dataset.PlanFiles{Plan: d.plan, Shards: d.shards}.Paths(ctx, microshards)
}

// loadData reads the dataset manifest, first preparing the dataset with the workload when
// the manifest is missing and dataset.prepare is on.
func loadData(ctx context.Context, cfg *config.Config, rtOpts pyruntime.Options, store *artifact.Store, fetch dataset.Fetcher, work progress.Tracker, log *slog.Logger) (*dataState, error) {
	path := cfg.Dataset.Manifest
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		if !cfg.Dataset.Prepare {
			return nil, fmt.Errorf("dataset.manifest: %s does not exist (run `p2pnode dataset build` or set dataset.prepare: true)", path)
		}
		if err := prepare(ctx, cfg, rtOpts, work, log); err != nil {
			return nil, err
		}
	}
	m, err := dataset.Load(path)
	if err != nil {
		return nil, fmt.Errorf("dataset.manifest: %w", err)
	}
	plan, err := dataset.NewPlan(m, cfg.Dataset.MicroshardBytes)
	if err != nil {
		return nil, err
	}
	shards, err := dataset.NewShardStore(store, cfg.Dataset.Root, m, fetch)
	if err != nil {
		return nil, err
	}
	shards.SetLogger(log.With("pkg", "dataset"))
	return &dataState{manifest: m, plan: plan, planID: plan.ID().String(), shards: shards}, nil
}

// PrepareDataset makes the config's dataset ready (preparing it with the workload when the
// manifest is missing, shown on work when not nil) and returns its microshard plan.
func PrepareDataset(ctx context.Context, cfg *config.Config, work progress.Tracker, log *slog.Logger) (*dataset.Plan, error) {
	store, err := artifact.OpenStore(filepath.Join(cfg.Node.StoreDir, "artifacts"), artifact.Options{ChunkSize: cfg.Node.ChunkSize})
	if err != nil {
		return nil, err
	}
	d, err := loadData(ctx, cfg, runtimeOptions(cfg, log), store, nil, work, log)
	if err != nil {
		return nil, err
	}
	return d.plan, nil
}

// prepare lets the workload write the dataset into a fresh directory next to
// dataset.root, builds its manifest there and only then renames it into place, so that a
// crash mid-way leaves nothing half-made. An existing, non-empty dataset.root without a
// manifest is the user's data: it is never overwritten.
func prepare(ctx context.Context, cfg *config.Config, rtOpts pyruntime.Options, work progress.Tracker, log *slog.Logger) error {
	root := filepath.Clean(cfg.Dataset.Root)
	// Nodes sharing a dataset directory (a demo, a test swarm) prepare it once: the first
	// takes the lock and prepares, the others wait and find the manifest.
	if err := os.MkdirAll(filepath.Dir(root), 0o755); err != nil {
		return fmt.Errorf("prepare dataset: %w", err)
	}
	lock, err := os.OpenFile(root+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("prepare dataset: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("prepare dataset: lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(cfg.Dataset.Manifest); err == nil {
		return nil
	}
	if ents, err := os.ReadDir(root); err == nil && len(ents) > 0 {
		return fmt.Errorf("dataset.root %s holds files but no manifest %s: run `p2pnode dataset build %s`, or empty the directory to let the workload prepare it", root, cfg.Dataset.Manifest, root)
	}
	if filepath.Dir(cfg.Dataset.Manifest) != root {
		return fmt.Errorf("dataset.manifest: the workload prepares the manifest in dataset.root (%s), not %s", root, cfg.Dataset.Manifest)
	}
	tmp := root + ".preparing"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("prepare dataset: %w", err)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return fmt.Errorf("prepare dataset: %w", err)
	}
	log.Info("preparing dataset", "factory", cfg.Workload.Factory, "dir", root)
	finish := watchDir(work, "preparing the dataset in "+root, tmp, time.Second)
	err = pyruntime.PrepareDataset(ctx, rtOpts, tmp)
	finish(err)
	if err != nil {
		return fmt.Errorf("prepare dataset in %s: %w", root, err)
	}
	m, err := dataset.Build(tmp, cfg.Experiment.ID, cfg.Node.ChunkSize)
	if err != nil {
		return err
	}
	if err := m.Write(filepath.Join(tmp, filepath.Base(cfg.Dataset.Manifest))); err != nil {
		return err
	}
	_ = os.Remove(root) // an empty directory may stand in the way of the rename
	if err := os.Rename(tmp, root); err != nil {
		return fmt.Errorf("prepare dataset: %w", err)
	}
	log.Info("dataset ready", "files", len(m.Files), "manifest", cfg.Dataset.Manifest)
	return nil
}

// watchDir shows the bytes the files under dir hold as a task on work, looking every
// period, until the returned func ends it: the workload prepares a dataset without saying
// how far it has got, but what it has written shows it.
func watchDir(work progress.Tracker, name, dir string, period time.Duration) (finish func(error)) {
	if work == nil {
		return func(error) {}
	}
	task := work.Start(name, progress.InBytes, 0, dirBytes(dir))
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				task.Set(dirBytes(dir))
			}
		}
	}()
	return func(err error) {
		close(stop)
		<-stopped
		task.Set(dirBytes(dir))
		task.Finish(err)
	}
}

// dirBytes is the size of the regular files under dir (what can be read of it).
func dirBytes(dir string) uint64 {
	var n uint64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += uint64(info.Size())
			}
		}
		return nil
	})
	return n
}
