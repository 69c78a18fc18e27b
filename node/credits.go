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
)

// Credits adds up every peer's account (credit.Ledger) over the chain held here, from head
// back to genesis or the oldest head held, counting the round notes signed by one of
// validators only.
func (s *Stores) Credits(head cid.Cid, validators []string) (*credit.Ledger, error) {
	var l credit.Ledger
	err := s.Heads.Walk(head, func(id cid.Cid, h *chain.Head) error {
		n, err := s.Heads.Notes(id)
		if err != nil || !slices.Contains(validators, n.Sig.Peer) {
			n = nil
		}
		l.Add(h, n)
		return nil
	})
	if err != nil && !errors.Is(err, chain.ErrNotFound) {
		return nil, fmt.Errorf("credits from head %s: %w", head, err)
	}
	return &l, nil
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
