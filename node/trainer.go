package node

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
)

// trainer is the trainer role: it trains the leases granted to it and announces the
// contributions.
type trainer struct {
	*env
	work windowTrainer
	// capacity is the measured training speed (samples per second), announced to validators.
	capacity *capacity
}

func (t *trainer) run(ctx context.Context) error {
	in := t.bus.Subscribe()
	defer in.Close()
	for {
		if t.done() { // the watcher ends the run once it has recorded the last head
			<-ctx.Done()
			return ctx.Err()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.tips.Changed():
		case l := <-in.Leases:
			if err := t.onLeases(ctx, l.From, l.Msg); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				t.log.Error("lease failed", "round", l.Msg.Round, "err", err)
				t.status.event("train", "round %d: %v", l.Msg.Round, err)
			}
		}
	}
}

func (t *trainer) onLeases(ctx context.Context, from string, m *gossip.Leases) (err error) {
	if !t.isValidator(from) || m.Issuer != from {
		return nil // only configured validators grant leases
	}
	var mine *int
	for i := range m.Leases {
		if m.Leases[i].Trainer == t.self {
			mine = &i
			break
		}
	}
	if mine == nil {
		return nil
	}
	l := m.Leases[*mine]
	if time.Now().UnixMilli() > l.Expiry {
		return nil // expired while queued
	}
	// A lease this trainer cannot finish is given back at once, so the round's leader
	// returns its microshards to the pool instead of waiting out the deadline.
	defer func() {
		if err != nil && ctx.Err() == nil && time.Now().UnixMilli() <= l.Expiry {
			t.release(ctx, l, err)
		}
	}()
	baseID, err := cid.Cast(l.Base)
	if err != nil {
		return err
	}
	base, err := t.baseHead(ctx, baseID)
	if err != nil {
		return fmt.Errorf("lease on head %s: %w", baseID, err)
	}
	if err := l.Check(baseID, base); err != nil {
		return err
	}
	leaseID := l.ID()
	t.status.update(func(s *Status) {
		s.Leases = []LeaseStatus{{Round: l.Round, Lease: leaseID.String(), Microshards: l.Microshards, Expiry: time.UnixMilli(l.Expiry)}}
	})
	defer t.status.update(func(s *Status) { s.Leases = nil })
	paramsID, err := base.ParamsID()
	if err != nil {
		return err
	}
	fetchStart := time.Now()
	if err := t.bus.Fetch(ctx, paramsID); err != nil {
		return fmt.Errorf("fetch params %s of round %d: %w", paramsID, base.Round, err)
	}
	fetched := time.Since(fetchStart)
	wctx, cancel := context.WithDeadline(ctx, time.UnixMilli(l.Expiry))
	defer cancel()
	steps := int(l.Steps)
	if steps == 0 {
		steps = t.cfg.Protocol.InnerSteps
	}
	res, err := t.work.Train(wctx, base, l.Microshards, steps, t.seed(l.Round, m.Attempt))
	if err != nil {
		if errors.Is(wctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			return fmt.Errorf("lease for round %d expired before training finished: %w", l.Round, err)
		}
		return err
	}
	t.capacity.observe(float64(res.Samples), res.TrainSeconds)
	t.capacity.observeWindow(res.Steps, res.Seconds)
	t.keeper.trained(res.OptState)
	c := &gossip.Contribution{Experiment: t.cfg.Experiment.ID, Round: l.Round, Base: l.Base, Lease: leaseID.Bytes(),
		Peer: t.self, Delta: res.Delta.Bytes(), Samples: res.Samples, Loss: res.Loss, Microshards: l.Microshards, Seconds: res.Seconds,
		TrainSeconds: res.TrainSeconds, FetchSeconds: fetched.Seconds() + res.FetchSeconds}
	t.status.update(func(s *Status) {
		s.Last = &ContributionInfo{Round: l.Round, Delta: res.Delta.String(), Samples: res.Samples, Loss: res.Loss, Seconds: res.Seconds, At: time.Now()}
	})
	t.metrics.trained(res.Samples, res.TrainSeconds, res.Loss)
	t.log.Info("trained", "round", l.Round, "microshards", len(l.Microshards), "samples", res.Samples, "loss", res.Loss, "seconds", fmt.Sprintf("%.2f", res.Seconds),
		"train_seconds", fmt.Sprintf("%.3f", res.TrainSeconds),
		"fetch_params_seconds", fmt.Sprintf("%.3f", fetched.Seconds()), "fetch_shards_seconds", fmt.Sprintf("%.3f", res.FetchSeconds))
	return t.bus.Publish(ctx, c)
}

// release tells the round's leader that this trainer gives lease l back because of err.
func (t *trainer) release(ctx context.Context, l lease.Lease, cause error) {
	reason := cause.Error()
	if len(reason) > gossip.MaxReleaseReason {
		reason = strings.ToValidUTF8(reason[:gossip.MaxReleaseReason], "")
	}
	msg := &gossip.Release{Experiment: t.cfg.Experiment.ID, Round: l.Round, Base: l.Base, Lease: l.ID().Bytes(), Peer: t.self, Reason: reason}
	if err := t.bus.Publish(ctx, msg); err != nil {
		t.log.Warn("release lease", "round", l.Round, "err", err)
		return
	}
	t.log.Info("released lease", "round", l.Round, "microshards", len(l.Microshards), "reason", reason)
}

// baseHead returns the lease's base head, which must be (or become shortly) this node's
// canonical head: leases on a head we have not accepted are not trained.
func (t *trainer) baseHead(ctx context.Context, id cid.Cid) (*chain.Head, error) {
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		// Watch for a change before looking: a head that becomes canonical between the look
		// and the wait would otherwise go unnoticed until the next one (a round later, or
		// never), and the lease would wait out the 10 s below.
		changed := t.tips.Changed()
		cur, h := t.tips.Current()
		if cur.Equals(id) {
			return h, nil
		}
		if h != nil {
			if _, bh, err := t.heads.Get(id); err == nil && bh.Round < h.Round {
				return nil, fmt.Errorf("stale lease: base round %d, canonical round %d", bh.Round, h.Round)
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		case <-deadline.C:
			return nil, fmt.Errorf("base head is not canonical here: %w", chain.ErrNotFound)
		}
	}
}

// seed is the worker's seed for a window: a function of the experiment's seed, the round,
// the lease attempt and this trainer's peer id, so a rerun draws the same batches while the
// trainers of one round draw different ones (with one seed for all, every trainer took its
// batches at the same offsets of its shards, in the same order).
func (t *trainer) seed(round, attempt uint64) int64 {
	return trainerSeed(t.cfg.Experiment.Seed, round, attempt, t.self)
}

func trainerSeed(experiment int64, round, attempt uint64, peer string) int64 {
	h := sha256.New()
	var b [24]byte
	binary.BigEndian.PutUint64(b[0:], uint64(experiment))
	binary.BigEndian.PutUint64(b[8:], round)
	binary.BigEndian.PutUint64(b[16:], attempt)
	h.Write(b[:])
	h.Write([]byte(peer))
	// 63 bits: torch.manual_seed takes any int64, and a non-negative seed reads the same in logs.
	return int64(binary.BigEndian.Uint64(h.Sum(nil)[:8]) >> 1)
}
