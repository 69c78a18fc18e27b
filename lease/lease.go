package lease

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
)

// ErrInvalid is wrapped by errors about a lease that does not check out.
var ErrInvalid = errors.New("invalid lease")

// Lease grants one trainer some microshards for one round on one base head.
type Lease struct {
	Round       uint64   `cbor:"1,keyasint"`
	Base        []byte   `cbor:"2,keyasint"` // base head CID
	Trainer     string   `cbor:"3,keyasint"`
	Microshards []uint32 `cbor:"4,keyasint"`
	Expiry      int64    `cbor:"5,keyasint"` // unix milliseconds
	Issuer      string   `cbor:"6,keyasint"`
	Epoch       uint64   `cbor:"7,keyasint"`
	// Steps is how many inner steps the trainer runs: the round's inner_steps scaled by the
	// trainer's capacity, so that fast and slow trainers finish near the same time.
	Steps uint32 `cbor:"8,keyasint,omitempty"`
	// Next reserves the trainer's microshards for the round after this one
	// (protocol.overlap: eager), and NextSteps its steps there. A trainer that has published
	// its update trains them at once, from its own model; the next round's leader leases them
	// to it again (with NextSteps) if its update was merged and they are still available.
	// Empty: no reservation. Only a hint: the next round's lease is what counts.
	Next      []uint32 `cbor:"9,keyasint,omitempty"`
	NextSteps uint32   `cbor:"10,keyasint,omitempty"`
}

// ID is the CID of the lease's canonical encoding.
func (l *Lease) ID() cid.Cid {
	b, err := chain.Marshal(l)
	if err != nil {
		panic(fmt.Sprintf("encode lease: %v", err)) // plain struct: cannot fail
	}
	return cids.Record(b)
}

// Ahead reports whether the lease is of the epoch after base's ledger: granted when the
// ledger's epoch had nothing left to lease, so that a trainer does not wait out the epoch's
// last rounds idle; its microshards are consumed in that epoch (chain.Ledger.Ahead).
func (l *Lease) Ahead(base *chain.Head) bool { return l.Epoch == base.Ledger.Epoch+1 }

// Check validates a lease against the head it is based on: right base and round, sorted
// microshards not consumed in the lease's epoch, which is the head's or the next one (a
// lease of the next epoch reserves nothing).
func (l *Lease) Check(baseID cid.Cid, base *chain.Head) error {
	if !slices.Equal(l.Base, baseID.Bytes()) {
		return fmt.Errorf("%w: lease for %s is on another base head", ErrInvalid, l.Trainer)
	}
	if l.Round != base.Round+1 {
		return fmt.Errorf("%w: lease for %s is for round %d, base head is round %d", ErrInvalid, l.Trainer, l.Round, base.Round)
	}
	ahead := l.Ahead(base)
	if l.Epoch != base.Ledger.Epoch && !ahead {
		return fmt.Errorf("%w: lease for %s is for epoch %d, ledger is in epoch %d", ErrInvalid, l.Trainer, l.Epoch, base.Ledger.Epoch)
	}
	if ahead && len(l.Next) > 0 {
		return fmt.Errorf("%w: lease for %s is of the next epoch and reserves microshards", ErrInvalid, l.Trainer)
	}
	if len(l.Microshards) == 0 || !slices.IsSorted(l.Microshards) {
		return fmt.Errorf("%w: lease for %s: microshards must be non-empty and sorted", ErrInvalid, l.Trainer)
	}
	if len(l.Microshards) > MaxLeaseMicroshards {
		return fmt.Errorf("%w: lease for %s grants %d microshards, at most %d", ErrInvalid, l.Trainer, len(l.Microshards), MaxLeaseMicroshards)
	}
	for i, s := range l.Microshards {
		if i > 0 && l.Microshards[i-1] == s {
			return fmt.Errorf("%w: lease for %s lists microshard %d twice", ErrInvalid, l.Trainer, s)
		}
		taken := consumed(base.Ledger, s)
		if ahead {
			taken = consumedAhead(base.Ledger, s)
		}
		if s >= base.Ledger.Shards || taken {
			return fmt.Errorf("%w: lease for %s: microshard %d is not available in epoch %d", ErrInvalid, l.Trainer, s, l.Epoch)
		}
	}
	return l.checkNext(base)
}

// checkNext checks a lease's reservation: none, or sorted microshards of the ledger's plan,
// none of them leased now, with steps.
func (l *Lease) checkNext(base *chain.Head) error {
	if len(l.Next) == 0 {
		if l.NextSteps != 0 {
			return fmt.Errorf("%w: lease for %s reserves steps but no microshards", ErrInvalid, l.Trainer)
		}
		return nil
	}
	if l.NextSteps == 0 || len(l.Next) > MaxLeaseMicroshards {
		return fmt.Errorf("%w: lease for %s: a reservation needs steps and at most %d microshards", ErrInvalid, l.Trainer, MaxLeaseMicroshards)
	}
	for i, s := range l.Next {
		if i > 0 && l.Next[i-1] >= s {
			return fmt.Errorf("%w: lease for %s: reserved microshards must be sorted, without repeats", ErrInvalid, l.Trainer)
		}
		if s >= base.Ledger.Shards {
			return fmt.Errorf("%w: lease for %s reserves microshard %d of a plan of %d", ErrInvalid, l.Trainer, s, base.Ledger.Shards)
		}
		if _, leased := slices.BinarySearch(l.Microshards, s); leased {
			return fmt.Errorf("%w: lease for %s reserves microshard %d, which it leases now", ErrInvalid, l.Trainer, s)
		}
	}
	return nil
}

// Bounds on the microshards a round leases. Leases, contributions and proposals list
// microshards, and each travels in one gossip message with a size bound (1 MiB for a grant,
// 64 KiB for a contribution, 4 MiB for a head with its proposal): capping one lease and one
// round keeps every such message inside its bound whatever the fleet size, the capacities
// or lease.microshards_per_trainer (gossip's size tests build the largest messages these
// bounds allow). A microshard id of a large plan costs 5 bytes in CBOR, so the biggest
// lease is about 20 KiB and a round's grant about 330 KiB plus some 200 bytes a trainer.
const (
	// MaxLeaseMicroshards is the most microshards one lease grants.
	MaxLeaseMicroshards = 4096
	// MaxRoundMicroshards is the most microshards leased in one round, over all its
	// attempts (the leases a proposal lists are disjoint).
	MaxRoundMicroshards = 65536
)

// Trainer is a candidate for a lease with its announced capacity (samples per second).
type Trainer struct {
	Peer     string
	Capacity float64
	// Proven: the trainer had a contribution merged recently. When microshards are short
	// (an epoch's tail) proven trainers are served first: announced capacity is the peer's
	// own claim, and a trainer whose updates fail or are rejected "finishes" fastest.
	Proven bool
	// SamplesPerStep is what one of its inner steps read in its last window (0 unknown): a
	// trainer with several ranks reads a batch on each per step.
	SamplesPerStep float64
}

// OneOf returns the trainer a round that leases one trainer per attempt (Book.Lone) takes
// from ts: the first proven one in peer order, else the first in peer order; nil when ts
// is empty.
func OneOf(ts []Trainer) []Trainer {
	if len(ts) == 0 {
		return nil
	}
	best := slices.MinFunc(ts, func(a, b Trainer) int {
		if a.Proven != b.Proven {
			if a.Proven {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Peer, b.Peer)
	})
	return []Trainer{best}
}

// Assign splits microshards among trainers in proportion to their capacity, so that trainers
// of different speeds finish near the same time. At most perTrainer microshards go to a
// trainer of average capacity (faster ones get proportionally more, up to
// MaxLeaseMicroshards, every trainer at least one while microshards last), and at most
// MaxRoundMicroshards in all. The choice is deterministic in (available, trainers, seed):
// microshards are drawn in a seed-dependent order so that successive epochs see the data in
// different orders. Trainers are returned in peer order; those that got nothing are omitted.
func Assign(available []uint32, trainers []Trainer, perTrainer int, seed []byte) map[string][]uint32 {
	return AssignWithin(available, trainers, perTrainer, MaxRoundMicroshards, seed)
}

// AssignWithin is Assign granting at most budget microshards in all: a round's later attempt
// passes what is left of MaxRoundMicroshards after the contributions already received.
func AssignWithin(available []uint32, trainers []Trainer, perTrainer, budget int, seed []byte) map[string][]uint32 {
	out := map[string][]uint32{}
	budget = min(budget, MaxRoundMicroshards)
	if len(available) == 0 || len(trainers) == 0 || perTrainer <= 0 || budget <= 0 {
		return out
	}
	ts := byPeer(trainers)
	rel := Relative(ts)
	for i := range ts {
		ts[i].Capacity = rel[ts[i].Peer]
	}
	order := shuffled(available, seed)
	want := make([]int, len(ts))
	sum := 0
	for i, t := range ts {
		want[i] = wantOf(perTrainer, t.Capacity)
		sum += want[i]
	}
	limit := min(len(order), budget)
	// Not enough microshards left: scale the shares down, keeping at least one each while
	// they last (proven trainers first, the fastest of them first).
	if sum > limit {
		byCap := make([]int, len(ts))
		for i := range byCap {
			byCap[i] = i
		}
		slices.SortStableFunc(byCap, func(a, b int) int {
			switch {
			case ts[a].Proven != ts[b].Proven:
				if ts[a].Proven {
					return -1
				}
				return 1
			case ts[a].Capacity > ts[b].Capacity:
				return -1
			case ts[a].Capacity < ts[b].Capacity:
				return 1
			}
			return 0
		})
		// One each, proven and fastest first; then the rest by highest average (D'Hondt), so shares stay
		// proportional to capacity and nobody gets more than they would unconstrained.
		alloc := make([]int, len(ts))
		left := limit
		for _, i := range byCap {
			if left == 0 {
				break
			}
			alloc[i], left = 1, left-1
		}
		for ; left > 0; left-- {
			best := -1
			for _, i := range byCap {
				if alloc[i] == 0 || alloc[i] >= want[i] {
					continue
				}
				if best < 0 || ts[i].Capacity/float64(alloc[i]+1) > ts[best].Capacity/float64(alloc[best]+1) {
					best = i
				}
			}
			if best < 0 {
				break
			}
			alloc[best]++
		}
		want = alloc
	}
	next := 0
	for i, t := range ts {
		n := min(want[i], len(order)-next)
		if n <= 0 {
			continue
		}
		shards := slices.Clone(order[next : next+n])
		slices.Sort(shards)
		out[t.Peer] = shards
		next += n
	}
	return out
}

// byPeer returns trainers sorted by peer id, one entry per peer.
func byPeer(trainers []Trainer) []Trainer {
	ts := slices.Clone(trainers)
	slices.SortFunc(ts, func(a, b Trainer) int { return strings.Compare(a.Peer, b.Peer) })
	return slices.CompactFunc(ts, func(a, b Trainer) bool { return a.Peer == b.Peer })
}

// shareOf is a trainer's share at relative capacity rel: perTrainer scaled, at least one.
func shareOf(perTrainer int, rel float64) int {
	return max(1, int(math.Round(float64(perTrainer)*rel)))
}

// wantOf is the microshards AssignWithin asks for a trainer of relative capacity rel before
// it meets what is left: its share, at most MaxLeaseMicroshards.
func wantOf(perTrainer int, rel float64) int {
	return min(MaxLeaseMicroshards, shareOf(perTrainer, rel))
}

// shuffled returns a deterministic permutation of xs keyed by seed (each element ranked by
// sha256(seed || element)).
func shuffled(xs []uint32, seed []byte) []uint32 {
	type ranked struct {
		key [32]byte
		x   uint32
	}
	rs := make([]ranked, len(xs))
	buf := make([]byte, len(seed)+4)
	copy(buf, seed)
	for i, x := range xs {
		buf[len(seed)], buf[len(seed)+1], buf[len(seed)+2], buf[len(seed)+3] = byte(x>>24), byte(x>>16), byte(x>>8), byte(x)
		rs[i] = ranked{key: sha256.Sum256(buf), x: x}
	}
	slices.SortFunc(rs, func(a, b ranked) int {
		if c := strings.Compare(string(a.key[:]), string(b.key[:])); c != 0 {
			return c
		}
		return int(a.x) - int(b.x)
	})
	out := make([]uint32, len(rs))
	for i, r := range rs {
		out[i] = r.x
	}
	return out
}

// Leaders orders validators for the round after the head: the first is the leader, the next
// takes over when the leader is silent past its timeout, and so on (rendezvous hashing on
// the head CID, so every node computes the same order).
func Leaders(validators []string, head cid.Cid) []string {
	type ranked struct {
		key [32]byte
		v   string
	}
	rs := make([]ranked, 0, len(validators))
	for _, v := range validators {
		rs = append(rs, ranked{key: sha256.Sum256(append(head.Bytes(), v...)), v: v})
	}
	slices.SortFunc(rs, func(a, b ranked) int {
		if c := strings.Compare(string(a.key[:]), string(b.key[:])); c != 0 {
			return c
		}
		return strings.Compare(a.v, b.v)
	})
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.v
	}
	return slices.Compact(out)
}

// Relative returns each trainer's capacity relative to the mean of the known ones. A
// trainer of unknown capacity counts as average, and when every known capacity is within
// 25% of the mean all count as average: that spread is measurement noise, not a mixed
// fleet, and treating it as equal keeps lease assignment stable from round to round.
func Relative(trainers []Trainer) map[string]float64 {
	out := make(map[string]float64, len(trainers))
	var sum float64
	var known int
	for _, t := range trainers {
		if t.Capacity > 0 && !math.IsInf(t.Capacity, 0) {
			sum += t.Capacity
			known++
		}
	}
	mean := sum / float64(max(known, 1))
	uniform := true
	for _, t := range trainers {
		if t.Capacity > 0 && !math.IsInf(t.Capacity, 0) && math.Abs(t.Capacity-mean) > 0.25*mean {
			uniform = false
		}
	}
	for _, t := range trainers {
		out[t.Peer] = 1
		if !uniform && t.Capacity > 0 && !math.IsInf(t.Capacity, 0) {
			out[t.Peer] = t.Capacity / mean
		}
	}
	return out
}

// Steps scales the round's inner steps to each trainer's relative step rate, so that
// every trainer's window takes about as long as an average trainer's: between a quarter
// and four times innerSteps. The step rate is the capacity over the samples a step reads
// (SamplesPerStep; the mean of the known ones where unknown): trainers whose steps read
// alike scale by capacity alone, and a trainer with N ranks, whose steps read N batches,
// gets N times the microshards (Assign) but not N times the steps as well, which would
// make its window N times as long and read each of its examples N times.
func Steps(trainers []Trainer, innerSteps int) map[string]int {
	rel := Relative(stepRates(trainers))
	lo, hi := max(1, (innerSteps+3)/4), 4*innerSteps
	out := make(map[string]int, len(trainers))
	for _, t := range trainers {
		out[t.Peer] = min(hi, max(lo, int(math.Round(float64(innerSteps)*rel[t.Peer]))))
	}
	return out
}

// stepRates returns the trainers with their capacity divided by their samples per step
// (see Steps); the trainers as they are when no samples per step is known.
func stepRates(trainers []Trainer) []Trainer {
	var sum float64
	known := 0
	for _, t := range trainers {
		if t.SamplesPerStep > 0 && !math.IsInf(t.SamplesPerStep, 0) {
			sum += t.SamplesPerStep
			known++
		}
	}
	if known == 0 {
		return trainers
	}
	mean := sum / float64(known)
	out := slices.Clone(trainers)
	for i := range out {
		per := out[i].SamplesPerStep
		if !(per > 0) || math.IsInf(per, 0) {
			per = mean
		}
		out[i].Capacity /= per
	}
	return out
}
