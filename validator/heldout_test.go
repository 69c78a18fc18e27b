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
// meanwhile, with notes that lack the metrics and say they are due; once the evaluation
// ends, the proposal goes out again with the metrics in its notes, or, when it yields only
// NaN, with notes that say it failed (so that nodes stop waiting for metrics), and the
// head's notes here are those. The last round's head is evaluated before it goes out, and
// carries the completed notes of the heads before it.
func TestLeaderPublishesItsHeadBeforeItEvaluatesIt(t *testing.T) {
	for _, failed := range []bool{false, true} {
		t.Run(map[bool]string{false: "evaluated", true: "the evaluation failed"}[failed], func(t *testing.T) {
			s := newPhaseSwarm(t, 2)
			release := make(chan struct{})
			evals := 0
			s.rt.EvalHook = func(m map[string]float64) map[string]float64 {
				if evals++; evals == 2 { // genesis, then round 1
					<-release
					if failed {
						return map[string]float64{"mse": math.NaN()}
					}
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
			require.True(t, first.Notes.HeldOutDue)
			require.Nil(t, first.Notes.HeldOut, "round 1's head went out before its evaluation ended")
			require.Nil(t, n.v.v.Tips.Notes(id).HeldOut)

			close(release)
			again := s.headOf(1, func(m *gossip.Head) bool { return m.Notes != nil && !m.Notes.HeldOutDue })
			require.Equal(t, first.Signed.ID(), again.Signed.ID())
			if failed {
				require.True(t, again.Notes.HeldOutFailed, "the notes say the evaluation failed")
				require.Nil(t, again.Notes.HeldOut)
			} else {
				require.Contains(t, again.Notes.HeldOut, "mse")
				require.False(t, again.Notes.HeldOutFailed)
			}
			require.Equal(t, first.Notes.Seconds, again.Notes.Seconds, "the rest of the notes is as published")
			require.Equal(t, again.Proposal, first.Proposal)
			require.Eventually(t, func() bool { return !n.v.v.Tips.Notes(id).HeldOutDue }, 10*time.Second, 10*time.Millisecond)
			require.Equal(t, again.Notes, n.v.v.Tips.Notes(id))

			s.train()
			last := s.headOf(2, nil)
			require.Contains(t, last.Notes.HeldOut, "mse", "the last round's head goes out with its metrics")
			// It carries the completed notes of the heads before it, for peers that missed them.
			require.Len(t, last.Earlier, 2, "round 1's and genesis's")
			require.Equal(t, id.Bytes(), last.Earlier[0].Head)
			require.Equal(t, *again.Notes, last.Earlier[0].Notes)
			require.Equal(t, uint64(0), last.Earlier[1].Notes.Round)
		})
	}
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
