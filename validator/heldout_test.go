package validator

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/gossip"
)

// TestLeaderPublishesItsHeadBeforeItEvaluatesIt: the leader's held-out evaluation of round
// 1's head is held until the test lets it go. The head goes out (and becomes canonical)
// meanwhile, with notes that lack the metrics; once the evaluation ends, the proposal goes
// out again with the metrics in its notes, and the head's notes here carry them. The last
// round's head is evaluated before it goes out, and carries the completed notes of the
// heads before it.
func TestLeaderPublishesItsHeadBeforeItEvaluatesIt(t *testing.T) {
	s := newPhaseSwarm(t, 2)
	release := make(chan struct{})
	evals := 0
	s.rt.EvalHook = func(m map[string]float64) map[string]float64 {
		if evals++; evals == 2 { // genesis, then round 1
			<-release
		}
		return m
	}
	s.start(1, "held-out validator")
	n := s.nodes[0]
	s.train()
	h := s.canonical(1)
	id, err := h.ID()
	require.NoError(t, err)
	first := s.headOf(1, nil)
	require.NotNil(t, first.Notes)
	require.Nil(t, first.Notes.HeldOut, "round 1's head went out before its evaluation ended")
	require.Nil(t, n.v.v.Tips.Notes(id).HeldOut)

	close(release)
	again := s.headOf(1, func(m *gossip.Head) bool { return m.Notes != nil && m.Notes.HeldOut != nil })
	require.Equal(t, first.Signed.ID(), again.Signed.ID())
	require.Contains(t, again.Notes.HeldOut, "mse")
	require.Equal(t, first.Notes.Seconds, again.Notes.Seconds, "the rest of the notes is as published")
	require.Equal(t, again.Proposal, first.Proposal)
	require.Eventually(t, func() bool { return n.v.v.Tips.Notes(id).HeldOut != nil }, 10*time.Second, 10*time.Millisecond)

	s.train()
	last := s.headOf(2, nil)
	require.Contains(t, last.Notes.HeldOut, "mse", "the last round's head goes out with its metrics")
	// It carries the completed notes of the heads before it, for peers that missed them.
	require.Len(t, last.Earlier, 2, "round 1's and genesis's")
	require.Equal(t, id.Bytes(), last.Earlier[0].Head)
	require.Equal(t, *again.Notes, last.Earlier[0].Notes)
	require.Equal(t, uint64(0), last.Earlier[1].Notes.Round)
}

// headOf waits for the next head of round r a validator publishes for which ok holds (nil:
// any).
func (s *phaseSwarm) headOf(r uint64, ok func(*gossip.Head) bool) *gossip.Head {
	s.t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case p := <-s.published:
			if m, isHead := p.msg.(*gossip.Head); isHead {
				if h, err := m.Signed.Decode(); err == nil && h.Round == r && (ok == nil || ok(m)) {
					return m
				}
			}
		case <-deadline:
			s.t.Fatalf("no head of round %d published", r)
		}
	}
}

// TestFailedEvaluationIsPublished: the leader's evaluation of round 1's head, published
// with its metrics due, yields only NaN. The proposal goes out again with notes that say
// the evaluation failed, so that nodes stop waiting for its metrics, and the next head
// carries those notes among the earlier ones.
func TestFailedEvaluationIsPublished(t *testing.T) {
	s := newPhaseSwarm(t, 2)
	evals := 0
	s.rt.EvalHook = func(m map[string]float64) map[string]float64 {
		if evals++; evals == 2 { // genesis, then round 1
			return map[string]float64{"mse": math.NaN()}
		}
		return m
	}
	s.start(1, "held-out validator")
	n := s.nodes[0]
	s.train()
	h := s.canonical(1)
	id, err := h.ID()
	require.NoError(t, err)
	first := s.headOf(1, nil)
	require.True(t, first.Notes.HeldOutDue)

	again := s.headOf(1, func(m *gossip.Head) bool { return m.Notes != nil && !m.Notes.HeldOutDue })
	require.True(t, again.Notes.HeldOutFailed, "the notes say the evaluation failed")
	require.Nil(t, again.Notes.HeldOut)
	require.Equal(t, first.Notes.Seconds, again.Notes.Seconds, "the rest of the notes is as published")
	require.Eventually(t, func() bool { return n.v.v.Tips.Notes(id).HeldOutFailed }, 10*time.Second, 10*time.Millisecond)

	s.train()
	last := s.headOf(2, nil)
	require.Contains(t, last.Notes.HeldOut, "mse")
	require.Len(t, last.Earlier, 2, "round 1's and genesis's")
	require.Equal(t, *again.Notes, last.Earlier[0].Notes)
}
