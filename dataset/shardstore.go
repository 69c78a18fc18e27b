package dataset

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/internal/progress"
)

// ErrUnavailable is returned for a dataset file that is neither in the artifact store nor
// in the dataset directory, and that no Fetcher could get.
var ErrUnavailable = errors.New("dataset file unavailable")

// ShardError is a microshard that could not be made available; it names the microshard
// and wraps the cause (artifact.ErrCorrupt for a file whose bytes do not match its CID,
// ErrUnavailable for one nobody could provide). A trainer gives the lease back on it.
type ShardError struct {
	Index int     // the microshard's index in the plan
	ID    cid.Cid // the microshard's id
	Err   error
}

func (e *ShardError) Error() string {
	return fmt.Sprintf("microshard %d (%s): %v", e.Index, e.ID, e.Err)
}

func (e *ShardError) Unwrap() error { return e.Err }

// Fetcher gets an artifact into the artifact store from elsewhere (peers, a URL). It
// returns nil only once the store holds the complete, verified artifact.
type Fetcher interface {
	Fetch(ctx context.Context, id cid.Cid) error
}

// ShardStore resolves microshards to local files whose bytes match the manifest. Files
// are served from the artifact store, so what the workload reads has been verified
// against its CID when it entered the store, whatever happens to the dataset directory
// afterwards.
type ShardStore struct {
	store *artifact.Store
	root  string
	m     *Manifest
	ids   []cid.Cid
	fetch Fetcher
	log   *slog.Logger
}

// NewShardStore serves m's files from store, importing them from root (the dataset
// directory; "" when there is none) or getting them through fetch (nil when there is no
// way to). The store's chunk size must be the one the manifest was built with.
func NewShardStore(store *artifact.Store, root string, m *Manifest, fetch Fetcher) (*ShardStore, error) {
	if store == nil {
		return nil, errors.New("new shard store: nil artifact store")
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("new shard store: %w", err)
	}
	ids, err := m.CIDs()
	if err != nil {
		return nil, fmt.Errorf("new shard store: %w", err)
	}
	return &ShardStore{store: store, root: root, m: m, ids: ids, fetch: fetch, log: slog.New(slog.DiscardHandler)}, nil
}

// IDs are the CIDs of the manifest's files, in manifest order.
func (s *ShardStore) IDs() []cid.Cid { return slices.Clone(s.ids) }

// SetLogger sets where the store reports files it had to replace (default: nowhere).
func (s *ShardStore) SetLogger(l *slog.Logger) { s.log = l }

// Paths returns the paths of ms's files in the artifact store, importing or fetching the
// ones it does not hold yet. The paths are read-only blob files named by CID, not by the
// dataset's file names: workloads must recognise a format by content, not extension.
func (s *ShardStore) Paths(ctx context.Context, ms Microshard) ([]string, error) {
	if err := s.check(ms); err != nil {
		return nil, err
	}
	paths := make([]string, len(ms.Files))
	for k, i := range ms.Files {
		if err := s.ensure(ctx, i); err != nil {
			return nil, &ShardError{Index: ms.Index, ID: ms.ID, Err: err}
		}
		paths[k] = s.store.BlobPath(s.ids[i])
	}
	return paths, nil
}

// PlanFiles resolves a plan's microshards, by index, to their files in a shard store: what
// a trainer hands its worker for a lease (round.ShardPaths).
type PlanFiles struct {
	Plan   *Plan
	Shards *ShardStore
}

// Paths returns the files of the microshards, in order (ShardStore.Paths of each).
func (f PlanFiles) Paths(ctx context.Context, microshards []uint32) ([]string, error) {
	var out []string
	for _, i := range microshards {
		if int(i) >= len(f.Plan.Shards) {
			return nil, fmt.Errorf("microshard %d out of range (plan has %d)", i, len(f.Plan.Shards))
		}
		p, err := f.Shards.Paths(ctx, f.Plan.Shards[i])
		if err != nil {
			return nil, err
		}
		out = append(out, p...)
	}
	return out, nil
}

// check refuses a microshard from a plan of another manifest: its id would not match.
func (s *ShardStore) check(ms Microshard) error {
	for _, i := range ms.Files {
		if i < 0 || i >= len(s.m.Files) {
			return fmt.Errorf("microshard %d (%s): file index %d outside manifest %q of %d files", ms.Index, ms.ID, i, s.m.Name, len(s.m.Files))
		}
	}
	if len(ms.Files) == 0 {
		return fmt.Errorf("microshard %d (%s): no files", ms.Index, ms.ID)
	}
	if got := shardID(s.m, ms.Files); !got.Equals(ms.ID) {
		return fmt.Errorf("microshard %d: id %s does not match its files in manifest %q (%s)", ms.Index, ms.ID, s.m.Name, got)
	}
	return nil
}

// Ensure makes every microshard of plan available locally; it stops at the first error.
func (s *ShardStore) Ensure(ctx context.Context, plan *Plan) error {
	for _, ms := range plan.Shards {
		if _, err := s.Paths(ctx, ms); err != nil {
			return err
		}
	}
	return nil
}

// ImportAll imports every manifest file from the dataset directory, without asking the
// Fetcher, so that this node can serve the dataset to peers. It reports every file that
// failed, not just the first, so one run lists all the damage.
func (s *ShardStore) ImportAll(ctx context.Context) error {
	var errs []error
	for i := range s.m.Files {
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, err)...)
		}
		if s.store.Has(s.ids[i]) {
			continue
		}
		if err := s.importLocal(i); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ensure gets file i into the artifact store: already there (and still intact), else
// from the dataset directory, else through the Fetcher.
func (s *ShardStore) ensure(ctx context.Context, i int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f, id := s.m.Files[i], s.ids[i]
	if s.store.Has(id) {
		// The blob is what the workload reads: checked again on every use (microshards are
		// small next to a round's training), so bytes that rotted on disk since they were
		// stored are replaced instead of failing every lease of this microshard.
		err := s.store.Verify(id)
		if err == nil {
			return nil
		}
		if rerr := s.store.Remove(id); rerr != nil {
			return fmt.Errorf("dataset file %q (%s) is damaged in the store (%v) and cannot be removed: %w", f.Path, id, err, rerr)
		}
		s.log.Warn("dataset file damaged in the store: getting it again", "file", f.Path, "cid", id.String(), "err", err)
	}
	err := s.importLocal(i)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		// A local file with the wrong bytes is an error, not a reason to go to peers:
		// the user's dataset directory is damaged and should be told so.
		return err
	}
	if s.fetch == nil {
		return fmt.Errorf("%w: %q (%s) is not in the store or %s, and there is no fetcher", ErrUnavailable, f.Path, id, s.rootName())
	}
	if err := s.fetch.Fetch(progress.WithName(ctx, "fetching dataset file "+f.Path), id); err != nil {
		return fmt.Errorf("%w: fetch %q (%s): %w", ErrUnavailable, f.Path, id, err)
	}
	if !s.store.Has(id) {
		return fmt.Errorf("%w: fetch %q (%s) returned without storing it", ErrUnavailable, f.Path, id)
	}
	return nil
}

// importLocal copies file i from the dataset directory into the store if its bytes hash to
// the manifest's CID; otherwise nothing is stored. A missing file wraps fs.ErrNotExist.
func (s *ShardStore) importLocal(i int) error {
	f, id := s.m.Files[i], s.ids[i]
	if s.root == "" {
		return fmt.Errorf("import dataset file %q: no dataset directory: %w", f.Path, fs.ErrNotExist)
	}
	path := filepath.Join(s.root, filepath.FromSlash(f.Path))
	r, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("import dataset file %q: %w", f.Path, err)
	}
	defer r.Close()
	// On a mismatch PutVerified's error names both the actual and the expected id.
	if err := s.store.PutVerified(r, id); err != nil {
		return fmt.Errorf("import dataset file %s: %w", path, err)
	}
	return nil
}

func (s *ShardStore) rootName() string {
	if s.root == "" {
		return "a dataset directory"
	}
	return s.root
}
