package upkeep

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"sync"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/checkpoint"
	"github.com/p2pnode/p2pnode/round"
)

// Names in a node checkpoint: the trainer's large state (blobs in the checkpoint's own
// store) and references to the head's artifacts (in the shared store), so that loading
// verifies them too and falls back to an older generation when they are damaged.
const (
	blobInnerOpt  = "inner_opt"
	BlobResidual  = "ef_residual"
	refHeadParams = "head_params"
	refHeadOuter  = "head_outer"
	// metaPaces holds a validator's trainer paces (JSON: peer id -> seconds per inner
	// step), so that a restarted validator sets its first deadlines from what it had
	// observed rather than from lease.round_timeout.
	metaPaces = "paces"
)

// Keeper turns the node's state into checkpoint snapshots: the canonical head, the
// trainer's inner-optimizer state and error-feedback residual. Writes happen in the
// checkpoint's background writer; the loops only hand over copies.
type Keeper struct {
	ck        *checkpoint.Checkpointer
	keepOuter bool

	mu      sync.Mutex
	optPath string // newest inner-optimizer state file
	// residual reads the trainer's error-feedback residual while the checkpoint writer
	// streams it (round.Trainer.ReadResidual); nil until trackResidual.
	residual func(f func(r []float32, tag string) error) error
	paces    func() map[string]float64 // the validator's paces to checkpoint; nil on trainers
	restored map[string]float64        // paces of the checkpoint resumed from
}

// TrackResidual has every later checkpoint carry the residual read reads, streamed from
// the trainer's own buffer by the checkpoint writer: no copy of a model-sized vector.
func (k *Keeper) TrackResidual(read func(f func(r []float32, tag string) error) error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.residual = read
}

// TrackPaces has every later checkpoint carry the paces f returns.
func (k *Keeper) TrackPaces(f func() map[string]float64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.paces = f
}

// RestoredPaces returns the paces of the checkpoint the node resumed from (nil if none).
func (k *Keeper) RestoredPaces() map[string]float64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.restored)
}

// NewKeeper is a keeper writing to ck. keepOuter says whether the head's outer optimizer
// state is this node's to keep (a validator's); a trainer neither fetches nor checkpoints it.
func NewKeeper(ck *checkpoint.Checkpointer, keepOuter bool) *Keeper {
	return &Keeper{ck: ck, keepOuter: keepOuter}
}

// Resumed is what a checkpoint gives back to the roles.
type Resumed struct {
	State       *checkpoint.State
	OptPath     string
	Residual    []float32
	ResidualTag string
	// ResidualErr is why a checkpointed residual was dropped (error feedback then starts
	// from zeros: only the unsent remainder of earlier rounds is lost).
	ResidualErr error
	// PacesErr is why checkpointed paces were dropped (deadlines are then learnt again).
	PacesErr error
}

// Restore loads the newest good checkpoint (checkpoint.ErrNoState when there is none).
func (k *Keeper) Restore() (*Resumed, error) {
	st, err := k.ck.Load()
	if err != nil {
		return nil, err
	}
	r := &Resumed{State: st}
	if s, ok := st.Meta[metaPaces]; ok {
		var p map[string]float64
		if err := json.Unmarshal([]byte(s), &p); err != nil {
			r.PacesErr = fmt.Errorf("checkpoint %s: %w", metaPaces, err)
		} else {
			k.mu.Lock()
			k.restored = p
			k.mu.Unlock()
		}
	}
	if _, ok := st.Blobs[blobInnerOpt]; ok {
		if r.OptPath, err = k.ck.BlobPath(st, blobInnerOpt); err != nil {
			return nil, err
		}
	}
	if _, ok := st.Blobs[BlobResidual]; ok {
		path, err := k.ck.BlobPath(st, BlobResidual)
		if err != nil {
			return nil, err
		}
		// Block reads into the trainer's vector: not a mapping of the file and a copy.
		r.Residual, r.ResidualTag, err = round.ReadResidual(path)
		if err != nil {
			r.ResidualErr = fmt.Errorf("checkpoint %s: %w", BlobResidual, err)
		}
	}
	k.Trained(r.OptPath)
	return r, nil
}

// Flush waits until every snapshot handed over so far is written.
func (k *Keeper) Flush(ctx context.Context) error { return k.ck.Flush(ctx) }

// Trained records the trainer's inner-optimizer state file after a window.
func (k *Keeper) Trained(optPath string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if optPath != "" {
		k.optPath = optPath
	}
}

// HeadChanged checkpoints the node at a new canonical head, in the background.
func (k *Keeper) HeadChanged(id cid.Cid, h *chain.Head) error {
	snap, err := k.snapshot(id, h)
	if err != nil {
		return err
	}
	k.ck.SaveAsync(snap)
	return nil
}

// snapshot describes the node's state at head id for the checkpoint writer. Nothing
// model-sized is copied: the inner-optimizer state is a file opened now (the writer reads
// it even if the trainer has moved on and removed it) and the residual is read from the
// trainer's buffer when the writer gets to it (see residualSource).
func (k *Keeper) snapshot(id cid.Cid, h *chain.Head) (snap checkpoint.Snapshot, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	snap = checkpoint.Snapshot{Round: h.Round, Head: id.String(), Streams: map[string]checkpoint.Source{}, Keep: map[string]cid.Cid{}}
	defer func() {
		if err != nil {
			for _, src := range snap.Streams {
				src.Close()
			}
			snap.Streams = nil
		}
	}()
	if p, err := h.ParamsID(); err == nil {
		snap.Keep[refHeadParams] = p
	}
	if o, err := h.OuterStateID(); err == nil && o.Defined() && k.keepOuter {
		snap.Keep[refHeadOuter] = o
	}
	if k.optPath != "" {
		src, err := checkpoint.OpenFile(k.optPath)
		if err != nil {
			return snap, fmt.Errorf("checkpoint inner optimizer state: %w", err)
		}
		snap.Streams[blobInnerOpt] = src
	}
	if k.paces != nil {
		if p := k.paces(); len(p) > 0 {
			b, err := json.Marshal(p) // keys sorted: the same paces give the same bytes
			if err != nil {
				return snap, fmt.Errorf("checkpoint %s: %w", metaPaces, err)
			}
			snap.Meta = map[string]string{metaPaces: string(b)}
		}
	}
	if k.residual != nil {
		snap.Streams[BlobResidual] = residualSource{read: k.residual}
	}
	return snap, nil
}

// residualSource streams the trainer's residual into a checkpoint blob while holding it
// against changes (round.Trainer.ReadResidual): an encoding waits for at most this write,
// and the blob is never a half-updated residual. The residual written is the newest when
// the writer gets to it, possibly a window newer than the head it is saved with: it is
// what the trainer still owes the model, whatever the head (see round.ResidualTag).
type residualSource struct {
	read func(f func(r []float32, tag string) error) error
}

func (s residualSource) WriteTo(w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	err := s.read(func(r []float32, tag string) error {
		if r == nil {
			return checkpoint.ErrNoBlob // no residual now (a fresh trainer, or reset)
		}
		return round.WriteResidual(cw, r, tag)
	})
	return cw.n, err
}

func (residualSource) Size() int64      { return -1 }
func (residualSource) Describe() string { return "the trainer's error-feedback residual" }
func (residualSource) Close() error     { return nil }

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.n += int64(k)
	return k, err
}
