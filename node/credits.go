package node

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/credit"
	"github.com/p2pnode/p2pnode/p2p"
	"github.com/p2pnode/p2pnode/status"
)

// Credits adds up every peer's account (credit.Ledger) over the chain held here, from head
// back to genesis or the oldest head held, counting the round notes signed by one of
// validators only.
func (s *Stores) Credits(head cid.Cid, validators []string) (*credit.Ledger, error) {
	var l credit.Ledger
	err := addChain(&l, s.Heads, head, func(id cid.Cid) *chain.Notes {
		n, err := s.Heads.Notes(id)
		if err != nil || !slices.Contains(validators, n.Sig.Peer) {
			return nil
		}
		return n
	})
	if err != nil {
		return nil, fmt.Errorf("credits from head %s: %w", head, err)
	}
	return &l, nil
}

// addChain adds head and its ancestors held in heads, with their notes, to l. A missing
// ancestor (a node resumed from a peer's checkpoint) ends the walk without an error.
func addChain(l *credit.Ledger, heads *chain.Store, head cid.Cid, notes func(cid.Cid) *chain.Notes) error {
	err := heads.Walk(head, func(id cid.Cid, h *chain.Head) error {
		l.Add(h, notes(id))
		return nil
	})
	if errors.Is(err, chain.ErrNotFound) {
		return nil
	}
	return err
}

// creditBook is the watcher's running credit.Ledger: the heads it records are added one by
// one; a head that does not follow the last one (the first after a start, a jump after
// catching up) has the ledger recounted from the chain.
type creditBook struct {
	ledger credit.Ledger
	head   string
}

// countCredit adds recorded head id to the accounts and puts them on the status page: the
// contributors, and this trainer's own account.
func (w *watcher) countCredit(id cid.Cid, h *chain.Head) {
	parent, _ := h.ParentID()
	if w.credits.head == "" || !parent.Defined() || w.credits.head != parent.String() {
		w.credits.ledger = credit.Ledger{}
		if err := addChain(&w.credits.ledger, w.heads, id, w.tips.Notes); err != nil {
			w.log.Debug("credits: the chain held here is unreadable", "head", id.String(), "err", err)
		}
	} else {
		w.credits.ledger.Add(h, w.tips.Notes(id))
	}
	w.credits.head = id.String()
	accounts := w.credits.ledger.Accounts()
	if len(accounts) > status.MaxContributors {
		accounts = accounts[:status.MaxContributors]
	}
	var mine *credit.Account
	summary := ""
	if w.cfg.Experiment.HasRole(config.RoleTrainer) {
		a := w.credits.ledger.Account(w.self)
		mine, summary = &a, a.Summary(h.Round)
	}
	w.status.Update(func(s *status.Status) {
		s.Contributors, s.Credit, s.CreditSummary = accounts, mine, summary
	})
}

// StoredPeerID is the peer id of the identity cfg names ("" when there is none yet: this
// reads, never creates, it).
func StoredPeerID(cfg *config.Config) (string, error) {
	path := cfg.Node.Identity
	if path == "" {
		path = filepath.Join(cfg.Node.StoreDir, "identity.key") // as the node's identity module
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	key, err := p2p.LoadIdentity(path, slog.New(slog.DiscardHandler))
	if err != nil {
		return "", err
	}
	return p2p.PeerID(key)
}

// tell logs what the notes of head id (when this node holds them) say of this trainer's
// own work: one WARN line for each reason its contributions to the round were rejected,
// and when it is quarantined and released (credit.Teller). A node that trains nothing is
// told nothing.
func (w *watcher) tell(id cid.Cid) {
	if w.teller == nil {
		return
	}
	for _, ev := range w.teller.Notes(w.tips.Notes(id)) {
		w.log.Warn(ev.String(), "round", ev.Round, "validator", ev.By)
		w.status.Event(ev.Kind, "%s", ev.String())
	}
}
