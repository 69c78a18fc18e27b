package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/lease"
)

// Stores are a node's on-disk stores, opened for inspection by commands (audit, export,
// verify) while the node may be running: they only read.
type Stores struct {
	Artifacts *artifact.Store
	Heads     *chain.Store
	dir       string
}

// OpenStores opens the stores under the config's store directory. It leaves temporary
// files alone: they may be the running node's writes in progress (the node removes its
// own leftovers when it starts).
func OpenStores(cfg *config.Config) (*Stores, error) {
	a, err := artifact.OpenStore(filepath.Join(cfg.Node.StoreDir, "artifacts"), artifact.Options{ChunkSize: cfg.Node.ChunkSize, LeaveTemps: true})
	if err != nil {
		return nil, err
	}
	h, err := chain.OpenStoreLeavingTemps(filepath.Join(cfg.Node.StoreDir, "heads"))
	if err != nil {
		return nil, err
	}
	return &Stores{Artifacts: a, Heads: h, dir: cfg.Node.StoreDir}, nil
}

// TipFile is written in the store directory with the canonical head's CID each time it
// changes, so that commands can find the latest head while the node runs.
const TipFile = "tip"

// ResolveHead turns "latest" (the node's newest canonical head) or a CID into a head id.
func (s *Stores) ResolveHead(arg string) (cid.Cid, error) {
	if arg != "" && arg != "latest" {
		id, err := cid.Decode(arg)
		if err != nil {
			return cid.Undef, fmt.Errorf("--head %q: %w", arg, err)
		}
		return id, nil
	}
	b, err := os.ReadFile(filepath.Join(s.dir, TipFile))
	if err != nil {
		return cid.Undef, fmt.Errorf("latest head of %s (has the node run?): %w", s.dir, err)
	}
	id, err := cid.Decode(strings.TrimSpace(string(b)))
	if err != nil {
		return cid.Undef, fmt.Errorf("latest head of %s: %w", s.dir, err)
	}
	return id, nil
}

// Audit walks the chain from head back to genesis and proves the ledger.
func (s *Stores) Audit(head cid.Cid) (lease.Report, error) {
	_, heads, err := s.Heads.Chain(head)
	if err != nil {
		return lease.Report{}, fmt.Errorf("audit %s: %w", head, err)
	}
	return lease.Audit(heads)
}
