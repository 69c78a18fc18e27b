package credit

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/p2pnode/p2pnode/chain"
)

// Account is one peer's credit.
type Account struct {
	Peer string `json:"peer"`
	// Merged counts its contributions merged into heads and Samples the samples they
	// trained (as its worker counted them).
	Merged  int    `json:"merged"`
	Samples uint64 `json:"samples"`
	// Rejected counts its rejected contributions by reason (chain.Rejection.Reason).
	Rejected map[string]int `json:"rejected,omitempty"`
	// Quarantines counts the quarantines it was put in (each distinct last round one), and
	// QuarantinedUntil is the last round of the latest (0: never quarantined).
	Quarantines      int    `json:"quarantines,omitempty"`
	QuarantinedUntil uint64 `json:"quarantined_until,omitempty"`
	// First and Last are the first and last rounds that merged or rejected its work.
	First uint64 `json:"first_round"`
	Last  uint64 `json:"last_round"`

	quarantines map[uint64]bool
}

// Rejections is how many of its contributions were rejected, for every reason.
func (a *Account) Rejections() int {
	n := 0
	for _, k := range a.Rejected {
		n += k
	}
	return n
}

// QuarantinedAt reports whether the peer is kept out of leases in round.
func (a *Account) QuarantinedAt(round uint64) bool {
	return a.QuarantinedUntil > 0 && round <= a.QuarantinedUntil
}

// Reasons lists the rejections by reason, most frequent first ("norm_outlier ×2, late").
func (a *Account) Reasons() string {
	reasons := slices.SortedFunc(maps.Keys(a.Rejected), func(x, y string) int {
		return cmp.Or(cmp.Compare(a.Rejected[y], a.Rejected[x]), cmp.Compare(x, y))
	})
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		parts[i] = r
		if n := a.Rejected[r]; n > 1 {
			parts[i] = fmt.Sprintf("%s ×%d", r, n)
		}
	}
	return strings.Join(parts, ", ")
}

// Summary is the account in one line, as of round: "merged 12 (3840 samples), rejected 2
// (norm_outlier ×2), quarantined until round 105".
func (a *Account) Summary(round uint64) string {
	s := fmt.Sprintf("merged %d (%d samples), rejected %d", a.Merged, a.Samples, a.Rejections())
	if r := a.Reasons(); r != "" {
		s += " (" + r + ")"
	}
	if a.QuarantinedAt(round) {
		s += fmt.Sprintf(", quarantined until round %d", a.QuarantinedUntil)
	}
	return s
}

func (a *Account) saw(round uint64) {
	if a.Merged+a.Rejections() == 0 || round < a.First {
		a.First = round
	}
	a.Last = max(a.Last, round)
}

// Ledger adds the heads of a chain up into accounts. Heads may be added in any order, each
// once; the zero value is empty and ready.
type Ledger struct {
	accounts map[string]*Account
	// Round is the highest round added.
	Round uint64
}

// Add counts head h and its round notes n (nil: none held).
func (l *Ledger) Add(h *chain.Head, n *chain.Notes) {
	if l.accounts == nil {
		l.accounts = map[string]*Account{}
	}
	l.Round = max(l.Round, h.Round)
	for _, c := range h.Contributions {
		a := l.account(c.Peer)
		a.saw(h.Round)
		a.Merged++
		a.Samples += c.Samples
	}
	if n == nil || n.Round != h.Round {
		return
	}
	for _, r := range n.Rejections {
		a := l.account(r.Peer)
		a.saw(h.Round)
		if a.Rejected == nil {
			a.Rejected = map[string]int{}
		}
		a.Rejected[r.Reason]++
	}
	for _, q := range n.Quarantined {
		a := l.account(q.Peer)
		if !a.quarantines[q.Until] {
			if a.quarantines == nil {
				a.quarantines = map[uint64]bool{}
			}
			a.quarantines[q.Until] = true
			a.Quarantines++
		}
		a.QuarantinedUntil = max(a.QuarantinedUntil, q.Until)
	}
}

func (l *Ledger) account(p string) *Account {
	a := l.accounts[p]
	if a == nil {
		a = &Account{Peer: p}
		l.accounts[p] = a
	}
	return a
}

// Account returns peer's account (an empty one when the chain never names it).
func (l *Ledger) Account(peer string) Account {
	if a := l.accounts[peer]; a != nil {
		return a.clone()
	}
	return Account{Peer: peer}
}

// Accounts returns every account, most merged first (then most samples, then by peer).
func (l *Ledger) Accounts() []Account {
	out := make([]Account, 0, len(l.accounts))
	for _, a := range l.accounts {
		out = append(out, a.clone())
	}
	slices.SortFunc(out, func(x, y Account) int {
		return cmp.Or(cmp.Compare(y.Merged, x.Merged), cmp.Compare(y.Samples, x.Samples), cmp.Compare(x.Peer, y.Peer))
	})
	return out
}

func (a *Account) clone() Account {
	c := *a
	c.Rejected = maps.Clone(a.Rejected)
	c.quarantines = nil
	return c
}
