package round

import (
	"context"
	"fmt"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/merge"
)

// Rebuild computes next's parameters (and, for diloco, its outer state) from its parent base
// and the contributions next names, as the validators computed them — same order, same
// recorded weights, same aggregator and outer step — and stores them. When they come out
// with next's CIDs the node holds next's artifacts without downloading them: with the sparse
// codec the contributions are ~0.5 % of the model each, the dense parameters 100 %.
//
// Screening is not repeated: next names the contributions the validators accepted, and the
// CID check is what makes the result trustworthy. Rebuild needs base's parameters and outer
// state and every contribution in the store (artifact.ErrNotFound otherwise), the policy
// next records to be m's own, and returns ErrMismatch when the result differs from next —
// in every failing case the caller downloads next's artifacts instead.
func (m *Merger) Rebuild(ctx context.Context, baseID cid.Cid, base, next *chain.Head) error {
	fail := func(err error) error { return fmt.Errorf("rebuild head round %d: %w", next.Round, err) }
	if parent, err := next.ParentID(); err != nil || !parent.Equals(baseID) || next.Round != base.Round+1 {
		return fail(fmt.Errorf("%w: base is not the parent", ErrMismatch))
	}
	if want := m.Policy.Record(); want != next.Policy {
		return fail(fmt.Errorf("%w: head merged with policy %+v, ours is %+v", ErrMismatch, next.Policy, want))
	}
	if len(next.Contributions) == 0 {
		return fail(fmt.Errorf("%w: no contributions", ErrMismatch))
	}
	paramsID, err := base.ParamsID()
	if err != nil {
		return fail(err)
	}
	for _, get := range []func() (cid.Cid, error){base.ParamsID, base.OuterStateID} {
		if id, err := get(); err != nil {
			return fail(err)
		} else if id.Defined() && !m.Store.Has(id) {
			return fail(fmt.Errorf("base artifact %s: %w", id, artifact.ErrNotFound))
		}
	}
	B, err := m.block()
	if err != nil {
		return fail(err)
	}
	baseR, momR, err := m.openBase(base, paramsID)
	if err != nil {
		return fail(err)
	}
	defer baseR.Close()
	if momR != nil {
		defer momR.Close()
	}
	layoutHash := baseR.Layout.Hash()
	n := int(baseR.Layout.Params())
	srcs := make([]*deltaSource, 0, len(next.Contributions))
	defer func() {
		for _, s := range srcs {
			s.Close()
		}
	}()
	weights := make([]float64, len(next.Contributions))
	merged := make([]Candidate, len(next.Contributions))
	var raw []byte
	for i, c := range next.Contributions {
		if err := ctx.Err(); err != nil {
			return err
		}
		id, err := cid.Cast(c.Artifact)
		if err != nil {
			return fail(fmt.Errorf("contribution of %s: %w", c.Peer, err))
		}
		if !m.Store.Has(id) {
			return fail(fmt.Errorf("contribution of %s %s: %w", c.Peer, id, artifact.ErrNotFound))
		}
		s, err := openDelta(m.Store, id, layoutHash, n, m.Workers, &raw)
		if err != nil {
			return fail(fmt.Errorf("contribution of %s: %w", c.Peer, err))
		}
		srcs = append(srcs, s)
		weights[i] = c.Weight
		merged[i] = Candidate{Peer: c.Peer, Delta: id, Samples: c.Samples, Microshards: c.Microshards, Loss: c.Loss, Ahead: c.Ahead}
	}
	in := newInputs(srcs, n, B)
	all := make([]int, len(srcs))
	for k := range all {
		all[k] = k
	}
	var norms []float64
	if m.Policy.Aggregator == merge.AggNormClip {
		// Screening with no checks is one pass of norms, computed exactly as Merge does.
		if norms, err = in.norms(ctx, all, m.Workers); err != nil {
			return fail(err)
		}
	}
	paramsOut, outerOut, err := m.step(ctx, B, baseR.Layout, baseR, momR, n, all, weights, norms, in)
	if err != nil {
		return fail(err)
	}
	h, err := buildHead(m.Policy, base, baseID, paramsOut, outerOut, merged)
	if err != nil {
		return fail(err)
	}
	if string(h.Params) != string(next.Params) || string(h.OuterState) != string(next.OuterState) {
		// Leave nothing behind that the head does not name.
		for _, b := range [][]byte{h.Params, h.OuterState} {
			if id, err := cid.Cast(b); err == nil && string(b) != string(next.Params) && string(b) != string(next.OuterState) {
				_ = m.Store.Remove(id)
			}
		}
		return fail(fmt.Errorf("%w: parameters or outer state differ from the head's", ErrMismatch))
	}
	return nil
}
