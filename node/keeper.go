package node

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
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
	blobResidual  = "ef_residual"
	refHeadParams = "head_params"
	refHeadOuter  = "head_outer"
	// metaPaces holds a validator's trainer paces (JSON: peer id -> seconds per inner
	// step), so that a restarted validator sets its first deadlines from what it had
	// observed rather than from lease.round_timeout.
	metaPaces = "paces"
)

// keeper turns the node's state into checkpoint snapshots: the canonical head, the
// trainer's inner-optimizer state and error-feedback residual. Writes happen in the
// checkpoint's background writer; the loops only hand over copies.
type keeper struct {
	ck        *checkpoint.Checkpointer
	keepOuter bool

	mu          sync.Mutex
	optPath     string // newest inner-optimizer state file
	residual    []float32
	residualTag string
	paces       func() map[string]float64 // the validator's paces to checkpoint; nil on trainers
	restored    map[string]float64        // paces of the checkpoint resumed from
}

// trackPaces has every later checkpoint carry the paces f returns.
func (k *keeper) trackPaces(f func() map[string]float64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.paces = f
}

// restoredPaces returns the paces of the checkpoint the node resumed from (nil if none).
func (k *keeper) restoredPaces() map[string]float64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.restored)
}

// keepOuter says whether the head's outer optimizer state is this node's to keep (a
// validator's); a trainer neither fetches nor checkpoints it.
func newKeeper(ck *checkpoint.Checkpointer, keepOuter bool) *keeper {
	return &keeper{ck: ck, keepOuter: keepOuter}
}

// resumed is what a checkpoint gives back to the roles.
type resumed struct {
	state       *checkpoint.State
	optPath     string
	residual    []float32
	residualTag string
	// residualErr is why a checkpointed residual was dropped (error feedback then starts
	// from zeros: only the unsent remainder of earlier rounds is lost).
	residualErr error
	// pacesErr is why checkpointed paces were dropped (deadlines are then learnt again).
	pacesErr error
}

// restore loads the newest good checkpoint (checkpoint.ErrNoState when there is none).
func (k *keeper) restore() (*resumed, error) {
	st, err := k.ck.Load()
	if err != nil {
		return nil, err
	}
	r := &resumed{state: st}
	if s, ok := st.Meta[metaPaces]; ok {
		var p map[string]float64
		if err := json.Unmarshal([]byte(s), &p); err != nil {
			r.pacesErr = fmt.Errorf("checkpoint %s: %w", metaPaces, err)
		} else {
			k.mu.Lock()
			k.restored = p
			k.mu.Unlock()
		}
	}
	if _, ok := st.Blobs[blobInnerOpt]; ok {
		if r.optPath, err = k.ck.BlobPath(st, blobInnerOpt); err != nil {
			return nil, err
		}
	}
	if _, ok := st.Blobs[blobResidual]; ok {
		b, err := k.ck.OpenBlob(st, blobResidual)
		if err != nil {
			return nil, err
		}
		r.residual, r.residualTag, err = round.ParseResidual(b.Bytes())
		b.Close()
		if err != nil {
			r.residualErr = fmt.Errorf("checkpoint %s: %w", blobResidual, err)
		}
	}
	k.trained(r.optPath, r.residual, r.residualTag)
	return r, nil
}

// trained records the trainer's state after a window.
func (k *keeper) trained(optPath string, residual []float32, residualTag string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if optPath != "" {
		k.optPath = optPath
	}
	if residual != nil {
		k.residual, k.residualTag = slices.Clone(residual), residualTag
	}
}

// headChanged checkpoints the node at a new canonical head, in the background.
func (k *keeper) headChanged(id cid.Cid, h *chain.Head) error {
	snap, err := k.snapshot(id, h)
	if err != nil {
		return err
	}
	k.ck.SaveAsync(snap)
	return nil
}

func (k *keeper) snapshot(id cid.Cid, h *chain.Head) (checkpoint.Snapshot, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	snap := checkpoint.Snapshot{Round: h.Round, Head: id.String(), Large: map[string][]byte{}, Keep: map[string]cid.Cid{}}
	if p, err := h.ParamsID(); err == nil {
		snap.Keep[refHeadParams] = p
	}
	if o, err := h.OuterStateID(); err == nil && o.Defined() && k.keepOuter {
		snap.Keep[refHeadOuter] = o
	}
	if k.optPath != "" {
		b, err := os.ReadFile(k.optPath)
		if err != nil {
			return snap, fmt.Errorf("checkpoint inner optimizer state %s: %w", k.optPath, err)
		}
		snap.Large[blobInnerOpt] = b
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
		b, err := round.EncodeResidual(k.residual, k.residualTag)
		if err != nil {
			return snap, fmt.Errorf("checkpoint %s: %w", blobResidual, err)
		}
		snap.Large[blobResidual] = b
	}
	return snap, nil
}
