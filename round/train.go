package round

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/pack"
	"github.com/p2pnode/p2pnode/pyruntime"
)

// ErrNonFinite is returned when the worker produced NaN or Inf parameters.
var ErrNonFinite = errors.New("non-finite parameters")

// ShardPaths resolves microshard indices to verified local files.
type ShardPaths interface {
	Paths(ctx context.Context, microshards []uint32) ([]string, error)
}

// Trainer turns leases into contributions. It keeps the inner optimizer state and the
// error-feedback residual between rounds; both are part of the node's checkpoint.
type Trainer struct {
	Runtime   pyruntime.Runtime
	Store     *artifact.Store
	Shards    ShardPaths
	Codec     diloco.Codec
	Int8Block int
	// Sparse shapes the sparse codec: block, top-k and the top-k warm-up (the window for
	// round r ≤ Sparse.Warmup keeps more values per block; diloco.SparseWarmupTopK).
	Sparse diloco.SparseShape
	// FeedbackDecay scales the sparse codec's residual as each encoding adds the new delta
	// to it (diloco.EncodeSparse's decay; 0 = diloco.DefaultFeedbackDecay, 1 = plain error
	// feedback).
	FeedbackDecay float64
	Workers       int
	// Prefix starts the names of this trainer's scratch files, so that two trainers on one
	// worker (a validator's reference beside the node's own training) do not share them.
	Prefix string
	// Fresh starts every window from a fresh inner optimizer and keeps no optimizer state:
	// the window then depends only on its base, data, steps and seed (a validator's
	// reference update, which any validator can train again).
	Fresh bool

	// OptState is the path of the latest inner-optimizer state file ("" = fresh optimizer).
	OptState string
	// Residual is the error-feedback residual of the int8 and sparse codecs (nil until
	// first used): what earlier encodings did not send. ResidualTag names the codec, its
	// settings and the pack layout it was made for; see ResidualTag for when it is reset.
	Residual    []float32
	ResidualTag string
	// residualMu is held for writing while an encoding updates Residual, and for reading
	// by ReadResidual (the checkpoint writer streaming it to disk), so that neither sees
	// the residual half-updated and the residual is never copied to be saved.
	residualMu sync.RWMutex
}

// residualTag is ResidualTag for this trainer's codec on a pack of the given layout, ""
// for the codecs without error feedback.
func (t *Trainer) residualTag(layoutHash string) string {
	switch t.Codec {
	case diloco.Int8:
		return ResidualTag(t.Codec, max(t.Int8Block, 0), 0, layoutHash)
	case diloco.Sparse:
		return ResidualTag(t.Codec, t.Sparse.Block, t.Sparse.TopK, layoutHash)
	}
	return ""
}

// Result is one trained lease.
type Result struct {
	Delta     cid.Cid
	Samples   uint64
	Loss      float64
	LossFirst float64
	LossLast  float64
	Steps     int
	Seconds   float64 // wall time of the window: fetch, train, encode, store
	// TrainSeconds is the worker's own time for the inner steps: the trainer's compute
	// capacity is samples / TrainSeconds.
	TrainSeconds float64
	// FetchSeconds is the time spent getting the window's microshards (from the local
	// cache, the dataset's source or peers).
	FetchSeconds float64
	Microshards  []uint32
	OptState     string // path of the new inner-optimizer state file
	DeltaNorm    float64
	// ResidualNorm is the sparse codec's error-feedback residual after this window's
	// encoding: what the trainer still owes the model (0 with the other codecs).
	ResidualNorm float64
}

// Train runs one window of steps inner steps on base's parameters over the given
// microshards and stores the encoded pseudo-gradient. seed makes the worker's batch order
// reproducible. It is RunWindow, then Encode.
func (t *Trainer) Train(ctx context.Context, base *chain.Head, microshards []uint32, steps int, seed int64) (*Result, error) {
	w, err := t.RunWindow(ctx, base, microshards, steps, seed)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	return w.Encode()
}

// Window is one trained window whose pseudo-gradient is not stored yet: the worker's
// output next to the base parameters. Encode stores it as Train does; a caller that needs
// the pseudo-gradient itself takes it with Delta and stores it with EncodeDelta. Close
// removes the worker's output.
type Window struct {
	t     *Trainer
	round uint64 // the round the window trains for
	// start is the pack the window's progress is measured from: a head's parameters, or
	// for a window trained ahead (RunWindowFrom) the scratch pack it started from (own,
	// which Close removes), or the head it was moved onto mid-window (MoveAhead).
	start       string
	own         string
	out, optOut string // the worker's output parameters and optimizer state
	res         pyruntime.TrainResult
	began       time.Time
	trained     time.Time // when the worker returned
	taken       time.Time // when a window trained ahead was taken (Take)
	fetched     float64   // seconds spent getting the microshards
	microshards []uint32
	layoutHash  string // the base's layout hash, set by Delta
}

// RunWindow runs the worker for one window (see Train) and returns its output, not yet
// encoded.
func (t *Trainer) RunWindow(ctx context.Context, base *chain.Head, microshards []uint32, steps int, seed int64) (*Window, error) {
	paramsID, err := base.ParamsID()
	if err != nil {
		return nil, err
	}
	if !t.Store.Has(paramsID) {
		return nil, fmt.Errorf("train on head round %d: params %s: %w", base.Round, paramsID, artifact.ErrNotFound)
	}
	return t.run(ctx, t.Store.BlobPath(paramsID), false, base.Round+1, microshards, steps, seed)
}

// RunWindowFrom runs a window for round from the pack at start instead of a head's
// parameters: a window trained ahead of its lease (protocol.overlap: eager) from the
// trainer's own model (Window.Rebase). The window owns start: Close removes it. While it
// trains, MoveAhead may move it onto the head it guessed at.
func (t *Trainer) RunWindowFrom(ctx context.Context, start string, round uint64, microshards []uint32, steps int, seed int64) (*Window, error) {
	w, err := t.run(ctx, start, true, round, microshards, steps, seed)
	if err != nil {
		os.Remove(start)
	}
	return w, err
}

// MoveAhead moves the window training ahead for round (RunWindowFrom) onto base, the head
// it was trained ahead for, once that head is here: the worker adds base's parameters minus
// the window's start to its model before its next step, so the steps left start from the
// real head, with the progress made so far kept (pyruntime.TrainJob.Shift). The window's
// update is then measured from base. A window that has finished, or a runtime that cannot
// shift, stays where it was: its update is then measured from its start, as before.
func (t *Trainer) MoveAhead(round uint64, base *chain.Head) error {
	paramsID, err := base.ParamsID()
	if err != nil {
		return err
	}
	if !t.Store.Has(paramsID) {
		return fmt.Errorf("move the window trained ahead for round %d onto head round %d: params %s: %w", round, base.Round, paramsID, artifact.ErrNotFound)
	}
	return pyruntime.WriteShift(t.shiftPath(round), t.Store.BlobPath(paramsID))
}

func (t *Trainer) shiftPath(round uint64) string {
	return filepath.Join(t.Runtime.ScratchDir(), fmt.Sprintf("%sahead-shift-%d.json", t.Prefix, round))
}

func (t *Trainer) run(ctx context.Context, start string, ahead bool, round uint64, microshards []uint32, steps int, seed int64) (w *Window, err error) {
	began := time.Now()
	prefix, own, shift := t.Prefix, "", ""
	if ahead {
		// A request left from an earlier process is removed before anything that takes
		// time: MoveAhead may write this window's own while its microshards are fetched.
		prefix, own, shift = t.Prefix+"ahead-", start, t.shiftPath(round)
		os.Remove(shift)
		defer func() {
			if err != nil {
				os.Remove(shift)
			}
		}()
	}
	shards, err := t.Shards.Paths(ctx, microshards)
	if err != nil {
		return nil, fmt.Errorf("train round %d: %w", round, err)
	}
	fetched := time.Since(began).Seconds()
	scratch := t.Runtime.ScratchDir()
	out := filepath.Join(scratch, fmt.Sprintf("%slocal-%d.safetensors", prefix, round))
	optOut := filepath.Join(scratch, fmt.Sprintf("%sopt-%d.safetensors", prefix, round))
	optIn := t.OptState
	if t.Fresh {
		optIn = ""
	}
	res, err := t.Runtime.Train(ctx, pyruntime.TrainJob{
		Base: start, Out: out, OptIn: optIn, OptOut: optOut,
		Shards: shards, Steps: steps, Seed: seed, Shift: shift,
	})
	if err != nil {
		os.Remove(out)
		os.Remove(optOut)
		return nil, fmt.Errorf("train round %d: %w", round, err)
	}
	if res.ShiftedTo != "" {
		start = res.ShiftedTo // the model was moved onto that head: progress is measured from it
	}
	return &Window{t: t, round: round, start: start, own: own, out: out, optOut: optOut, res: res,
		began: began, trained: time.Now(), fetched: fetched, microshards: microshards}, nil
}

// MovedAt is the step before which the worker moved the window onto the head it was
// trained ahead for (MoveAhead), or −1.
func (w *Window) MovedAt() int {
	if w.res.ShiftedTo == "" {
		return -1
	}
	return w.res.ShiftedAt
}

// Close removes the worker's output parameters and, for a window trained ahead, its start
// pack and a move request that came after its last step.
func (w *Window) Close() {
	if w.out != "" {
		os.Remove(w.out)
	}
	if w.own != "" {
		os.Remove(w.own)
		os.Remove(w.t.shiftPath(w.round))
	}
}

// Drop closes a window that will not be encoded, and removes its optimizer state too:
// the trainer goes on from the state it had before the window.
func (w *Window) Drop() {
	w.Close()
	if w.optOut != w.t.OptState {
		os.Remove(w.optOut)
	}
}

// Rebase writes the model this trainer goes on from after the window (its eager guess at
// the next head) to a scratch pack and returns its path. base is the head the window's
// update is measured against, parent base's parent (nil: none) and n the updates base
// merged. The guess is
//
//	base + (local − start)/n + (base − parent)·(n − 1)/n
//
// the trainer's own progress as its 1/n share of the next merge and the others' shares
// taken to be what they were in base's (Eager Updates' proxy, arXiv 2502.12996). With
// n = 1, or no parent, or the parent's parameters not in the store, it is base plus the
// window's whole progress; a window that started from base then ends where its output is,
// and that is moved, not recomputed. It streams the packs a block at a time.
func (w *Window) Rebase(base, parent *chain.Head, n int) (string, error) {
	paramsID, err := base.ParamsID()
	if err != nil {
		return "", err
	}
	parentPath := ""
	if parent != nil && n > 1 {
		if pid, err := parent.ParamsID(); err == nil && w.t.Store.Has(pid) {
			parentPath = w.t.Store.BlobPath(pid)
		}
	}
	dst := filepath.Join(w.t.Runtime.ScratchDir(), fmt.Sprintf("start-%d.safetensors", w.round+1))
	basePath := w.t.Store.BlobPath(paramsID)
	if basePath == w.start && parentPath == "" {
		if err := os.Rename(w.out, dst); err != nil {
			return "", fmt.Errorf("rebase round %d: %w", w.round, err)
		}
		w.out = ""
		return dst, nil
	}
	if err := rebase(basePath, w.start, w.out, parentPath, n, dst); err != nil {
		os.Remove(dst)
		return "", fmt.Errorf("rebase round %d on head round %d: %w", w.round, base.Round, err)
	}
	return dst, nil
}

// Take marks a window trained ahead as taken for its lease: its wall time (Result.Seconds)
// leaves out the wait between the worker's end and now.
func (w *Window) Take() { w.taken = time.Now() }

// rebase writes base + (local − start)/n + (base − parent)·(n − 1)/n to dst, in float32;
// without parentPath, base + (local − start).
func rebase(basePath, startPath, localPath, parentPath string, n int, dst string) error {
	var rs [4]*pack.PackReader
	paths := []string{basePath, startPath, localPath}
	if parentPath != "" {
		paths = append(paths, parentPath)
	}
	for i, p := range paths {
		r, err := pack.OpenPackReader(p)
		if err != nil {
			return err
		}
		defer r.Close()
		if i > 0 && !pack.SameLayout(r.Layout, rs[0].Layout) {
			return fmt.Errorf("%w: %s has layout %s, the head %s", pack.ErrLayoutMismatch, p, r.Layout.Hash(), rs[0].Layout.Hash())
		}
		rs[i] = r
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	sw, err := pack.NewStreamWriter(bw, rs[0].Layout, nil)
	if err != nil {
		return err
	}
	own, others := float32(1), float32(0)
	if n > 1 {
		own, others = 1/float32(n), float32(n-1)/float32(n)
	}
	params := rs[0].Layout.Params()
	var b, s, l, pp [StreamBlock]float32
	for lo := int64(0); lo < params; lo += StreamBlock {
		k := int(min(StreamBlock, params-lo))
		for i, dst := range [][]float32{b[:k], s[:k], l[:k], pp[:k]} {
			if rs[i] == nil {
				continue
			}
			if err := rs[i].ReadValues(lo, dst); err != nil {
				return err
			}
		}
		if rs[3] == nil {
			for i := range k {
				b[i] += l[i] - s[i]
			}
		} else {
			for i := range k {
				b[i] += own*(l[i]-s[i]) + others*(b[i]-pp[i])
			}
		}
		if err := sw.Write(b[:k]); err != nil {
			return err
		}
	}
	if err := sw.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// Encode encodes and stores the window's pseudo-gradient with the trainer's codec. The
// dense codecs stream it from the two packs (encodeDense); the sparse one needs it whole.
func (w *Window) Encode() (*Result, error) {
	if w.t.Codec != diloco.Sparse {
		id, norm, err := w.t.encodeDense(w.start, w.out)
		if err != nil {
			return nil, fmt.Errorf("train round %d: %w", w.round, err)
		}
		return w.done(id, norm), nil
	}
	delta, err := w.Delta()
	if err != nil {
		return nil, err
	}
	return w.EncodeDelta(delta)
}

// Delta returns the window's pseudo-gradient (base − local), after checking that the
// worker's output has the base's layout and only finite values.
func (w *Window) Delta() ([]float32, error) {
	basePack, err := pack.Load(w.start)
	if err != nil {
		return nil, fmt.Errorf("train round %d: start params: %w", w.round, err)
	}
	defer basePack.Close()
	local, err := pack.Load(w.out)
	if err != nil {
		return nil, fmt.Errorf("train round %d: worker output: %w", w.round, err)
	}
	defer local.Close()
	if err := local.CheckLayout(basePack.Layout); err != nil {
		return nil, fmt.Errorf("train round %d: worker output: %w", w.round, err)
	}
	if name := local.Finite(); name != "" {
		return nil, fmt.Errorf("train round %d: %w: worker returned NaN/Inf in tensor %q", w.round, ErrNonFinite, name)
	}
	delta := make([]float32, len(basePack.Values))
	if err := diloco.PseudoGradient(delta, basePack.Values, local.Values, w.t.Workers); err != nil {
		return nil, fmt.Errorf("train round %d: %w", w.round, err)
	}
	w.layoutHash = basePack.Layout.Hash()
	return delta, nil
}

// EncodeDelta encodes delta, the window's pseudo-gradient from Delta, with the trainer's
// codec and error feedback, and stores it.
func (w *Window) EncodeDelta(delta []float32) (*Result, error) {
	t := w.t
	var residual []float32
	t.residualMu.Lock()
	if tag := t.residualTag(w.layoutHash); tag != "" {
		if len(t.Residual) != len(delta) || t.ResidualTag != tag {
			t.Residual, t.ResidualTag = make([]float32, len(delta)), tag
		}
		residual = t.Residual
	}
	var enc diloco.Encoded
	var err error
	var resNorm float64
	if t.Codec == diloco.Sparse {
		decay := t.FeedbackDecay
		if decay == 0 {
			decay = diloco.DefaultFeedbackDecay
		}
		// The residual is written only when the encoding succeeds, so a retried round
		// starts from the same residual.
		enc, err = diloco.EncodeSparse(delta, residual, t.Sparse.Block, t.Sparse.TopKFor(w.round), decay, t.Workers)
		if err == nil {
			resNorm = merge.Norm(residual, t.Workers)
		}
	} else {
		enc, err = diloco.Encode(t.Codec, delta, residual, t.Int8Block, t.Workers)
	}
	t.residualMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("train round %d: encode delta: %w", w.round, err)
	}
	id, err := StoreDelta(t.Store, enc, w.layoutHash)
	if err != nil {
		return nil, fmt.Errorf("train round %d: %w", w.round, err)
	}
	res := w.done(id, merge.Norm(delta, t.Workers))
	res.ResidualNorm = resNorm
	return res, nil
}

// StoreRaw stores delta, the window's pseudo-gradient from Delta, as raw fp32: no codec,
// no error feedback, none of the codecs' checks (a delta that is not finite is stored as
// it is, as an attacker would send it).
func (w *Window) StoreRaw(delta []float32) (*Result, error) {
	raw := diloco.Encoded{Codec: diloco.FP32, N: len(delta), Data: pack.Float32Bytes(delta)}
	id, err := StoreDelta(w.t.Store, raw, w.layoutHash)
	if err != nil {
		return nil, fmt.Errorf("train round %d: %w", w.round, err)
	}
	return w.done(id, merge.Norm(delta, w.t.Workers)), nil
}

// done keeps the window's optimizer state for the next window and reports the stored delta.
func (w *Window) done(id cid.Cid, norm float64) *Result {
	if w.t.Fresh {
		os.Remove(w.optOut)
	} else {
		w.t.keepOptState(w.t.Runtime.ScratchDir(), w.optOut)
	}
	res := w.res
	wall := time.Since(w.began)
	if !w.taken.IsZero() {
		wall = w.trained.Sub(w.began) + time.Since(w.taken)
	}
	return &Result{
		Delta: id, Samples: uint64(res.Samples), Loss: res.Loss, LossFirst: res.LossFirst, LossLast: res.LossLast,
		Steps: res.Steps, Seconds: wall.Seconds(), TrainSeconds: res.Seconds, FetchSeconds: w.fetched,
		Microshards: w.microshards, OptState: w.optOut, DeltaNorm: norm,
	}
}

// ReadResidual calls f with the error-feedback residual and its tag (nil and "" when there
// is none); no encoding changes them until f returns. f must not keep r.
func (t *Trainer) ReadResidual(f func(r []float32, tag string) error) error {
	t.residualMu.RLock()
	defer t.residualMu.RUnlock()
	return f(t.Residual, t.ResidualTag)
}

// keepOptState makes optOut the inner-optimizer state, removing the previous one if it was
// a scratch file.
func (t *Trainer) keepOptState(scratch, optOut string) {
	if t.OptState != "" && t.OptState != optOut && filepath.Dir(t.OptState) == scratch {
		os.Remove(t.OptState)
	}
	t.OptState = optOut
}

// encodeDense encodes and stores the delta of the worker's output against the base params
// with a dense codec, streaming (encodeStreaming): the Go side of a trainer then holds the
// residual and a few blocks, not the base, the local model, the delta and its encoding.
func (t *Trainer) encodeDense(start, out string) (cid.Cid, float64, error) {
	baseR, err := pack.OpenPackReader(start)
	if err != nil {
		return cid.Undef, 0, fmt.Errorf("start params: %w", err)
	}
	defer baseR.Close()
	localR, err := pack.OpenPackReader(out)
	if err != nil {
		return cid.Undef, 0, fmt.Errorf("worker output: %w", err)
	}
	defer localR.Close()
	if !pack.SameLayout(localR.Layout, baseR.Layout) {
		return cid.Undef, 0, fmt.Errorf("worker output: %w: pack has layout %s, expected %s", pack.ErrLayoutMismatch, localR.Layout.Hash(), baseR.Layout.Hash())
	}
	var residual []float32
	n := int(baseR.Layout.Params())
	t.residualMu.Lock()
	defer t.residualMu.Unlock()
	if tag := t.residualTag(baseR.Layout.Hash()); tag != "" {
		if len(t.Residual) != n || t.ResidualTag != tag {
			t.Residual, t.ResidualTag = make([]float32, n), tag
		}
		residual = t.Residual
	}
	id, norm, err := encodeStreaming(t.Store, baseR, localR, t.Codec, t.Int8Block, residual, t.Workers)
	if err != nil && residual != nil {
		// The blocks before the failure updated the residual: start error feedback afresh
		// rather than carry a half-updated remainder.
		t.Residual, t.ResidualTag = nil, ""
	}
	return id, norm, err
}
