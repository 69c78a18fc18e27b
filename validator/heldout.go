package validator

import (
	"context"
	"sync"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
)

// A leader evaluates the head it proposed on held-out data after it has published it, not
// before. The evaluation is a forward pass over the workload's held-out text: on lm tiny
// with 2 cores it took as long as 4 inner steps, and it held every round's head back by as
// much. Trainers waited for the next lease that long, or, training ahead under
// protocol.overlap: eager, ran that many more steps from their guess at the head before
// the window could be moved onto it. The head now goes out with notes that lack the
// held-out metrics and say they are due (chain.Notes.HeldOutDue), and the same proposal
// goes out again with the completed notes once they are measured, or with notes that say
// the evaluation failed (chain.Notes.HeldOutFailed; chain.Tips.SetNotes keeps either). A
// peer can miss that message (not yet subscribed, or it synced the head before the
// evaluation ended), so each proposal also carries the completed notes of the heads
// before it (gossip.Head.Earlier), and a node that catches up asks again for notes still
// due (headsync). The experiment's last head is evaluated before it is published: nothing
// waits for it, and the run ends with its metrics.

// heldOutJob is a published head whose held-out metrics are still to be measured.
type heldOutJob struct {
	id    cid.Cid
	head  *chain.Head
	notes chain.Notes // as published (signed, without held-out metrics)
	msg   gossip.Head // the proposal as published
}

// heldOut evaluates published heads one at a time, in the order they were proposed.
type heldOut struct {
	jobs    chan heldOutJob
	slots   chan struct{}  // one per head handed over (or about to be) and not yet done
	pending sync.WaitGroup // the same, for evaluated
	done    chan struct{}
}

// maxEvaluating is how many proposed heads may wait for their held-out metrics: one being
// evaluated and the next. A leader whose evaluations take longer than its rounds waits
// for the first before it publishes a third, so a head is never more than two heads
// behind with its metrics (the node's watcher waits that long for them).
const maxEvaluating = 2

// startHeldOut starts the evaluator of published heads; stop closes it once the heads
// handed to it are evaluated (or ctx ended).
func (v *validator) startHeldOut(ctx context.Context) (stop func()) {
	h := &heldOut{jobs: make(chan heldOutJob, maxEvaluating), slots: make(chan struct{}, maxEvaluating), done: make(chan struct{})}
	v.heldOut = h
	go func() {
		defer close(h.done)
		for j := range h.jobs {
			v.completeNotes(ctx, j)
			h.release()
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(h.jobs)
			<-h.done
			v.heldOut = nil
		})
	}
}

// reserve takes a place for head h with the evaluator, waiting while maxEvaluating heads
// wait for their metrics, when an evaluation is due for it. It reports whether it took
// one: then h must be handed over (evaluateLater) or its place released.
func (v *validator) reserve(ctx context.Context, h *chain.Head) bool {
	if v.heldOut == nil || !v.evalDue(h) {
		return false
	}
	select {
	case v.heldOut.slots <- struct{}{}:
		v.heldOut.pending.Add(1)
		return true
	case <-ctx.Done():
		return false
	}
}

// release gives a place back.
func (h *heldOut) release() {
	h.pending.Done()
	<-h.slots
}

// evaluateLater hands a published head, whose place is reserved, to the evaluator.
func (v *validator) evaluateLater(j heldOutJob) { v.heldOut.jobs <- j }

// evaluated waits until every head handed to the evaluator has its notes completed (or
// ctx ended, which ends its evaluations too).
func (v *validator) evaluated() {
	if v.heldOut != nil {
		v.heldOut.pending.Wait()
	}
}

// completeNotes measures j's head on held-out data and publishes the proposal again with
// the notes completed: with the metrics, or, when the evaluation failed (evaluate logged
// why), saying so, so that no node waits for metrics that will not come.
func (v *validator) completeNotes(ctx context.Context, j heldOutJob) {
	m := v.evaluate(ctx, j.head)
	if m == nil && ctx.Err() != nil {
		return // shutting down: the evaluation was abandoned, not failed
	}
	n := j.notes
	n.HeldOut, n.HeldOutFailed, n.HeldOutDue, n.Sig = m, m == nil, false, chain.Signature{}
	if err := v.signNotes(j.id, j.head.Round, &n); err != nil {
		v.Log.Warn("record the held-out metrics of a head", "round", j.head.Round, "err", err)
		return
	}
	msg := j.msg
	if sh, _, err := v.Heads.Get(j.id); err == nil {
		msg.Signed = *sh // with every signature gathered so far
	}
	msg.Notes, msg.Sent = &n, time.Now().UnixMilli()
	if err := v.Bus.Publish(ctx, &msg); err != nil && ctx.Err() == nil {
		v.Log.Warn("publish the held-out metrics of a head", "round", j.head.Round, "err", err)
	}
}

// earlierNotes are the completed notes (chain.Notes.Completed) this node holds of the heads
// before h, newest first, from the gossip.MaxEarlierNotes heads before it: a proposal
// carries them for the peers that missed them when they went out (not yet subscribed, or
// synced the head before its evaluation ended). reserve has waited for the evaluation
// maxEvaluating heads back, so the notes of the head that falls out of the watcher's wait
// (node/heads.go) are among them.
func (v *validator) earlierNotes(h *chain.Head) []gossip.EarlierNotes {
	parent, err := h.ParentID()
	if err != nil {
		return nil
	}
	var out []gossip.EarlierNotes
	walked := 0
	_ = v.Heads.Walk(parent, func(id cid.Cid, _ *chain.Head) error {
		if n := v.Tips.Notes(id); n != nil && n.Completed() {
			out = append(out, gossip.EarlierNotes{Head: id.Bytes(), Notes: *n})
		}
		if walked++; walked == gossip.MaxEarlierNotes {
			return chain.StopWalk
		}
		return nil
	})
	return out
}
