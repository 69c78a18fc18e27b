package validator

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/internal/atomicfile"
)

// GrantsFile is written in a validator's store directory before each grant of leases it
// publishes: its own grants of the rounds still open here. A validator restarted mid-round
// reads them back, so that a contribution made under a lease it granted before the restart
// is known for its own lease — rejected as late, no strike toward quarantine and no bar
// from the round — rather than taken for work nobody leased (no_lease), which barred the
// trainers from the leases of the restarted leader's new grant: in the WAN lab's faults
// run, five of six trainers lost the round after the validator's restart so (docs/wan.md).
// Unlike LocksFile, nothing unsafe follows from its loss: a file that cannot be read or
// written is reported and done without.
const GrantsFile = "grants"

type grantsFile struct {
	Grants [][]byte `cbor:"1,keyasint"` // gossip.Encode of each grant, oldest first
}

func (v *validator) grantsPath() string { return filepath.Join(v.Config.Node.StoreDir, GrantsFile) }

// keepGrant records grant m, which this validator is about to publish, with its own grants
// of rounds after below (the others are closed here) in GrantsFile.
func (v *validator) keepGrant(m *gossip.Leases, below uint64) {
	v.ownGrants = slices.DeleteFunc(v.ownGrants, func(g *gossip.Leases) bool { return g.Round <= below })
	v.ownGrants = append(v.ownGrants, m)
	f := grantsFile{}
	for _, g := range v.ownGrants {
		b, err := gossip.Encode(g)
		if err != nil {
			v.Log.Warn("grant not kept for a restart", "round", m.Round, "err", err)
			return
		}
		f.Grants = append(f.Grants, b)
	}
	b, err := chain.Marshal(&f)
	if err == nil {
		err = atomicfile.Write(v.grantsPath(), b, 0o644)
	}
	if err != nil {
		v.Log.Warn("grant not kept for a restart: its trainers' contributions would be taken for unleased after one",
			"round", m.Round, "file", v.grantsPath(), "err", err)
	}
}

// restoreGrants reads this validator's grants of its previous run back from GrantsFile,
// those of rounds after the canonical head's, into the grant log (keepGrant wrote them in
// the order it granted them).
func (v *validator) restoreGrants() {
	b, err := os.ReadFile(v.grantsPath())
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	var f grantsFile
	if err == nil {
		err = chain.Unmarshal(b, &f)
	}
	if err != nil {
		v.Log.Warn("grants of the previous run unreadable: contributions under them will be taken for unleased",
			"file", v.grantsPath(), "err", err)
		return
	}
	var tip uint64
	if v.Tips != nil {
		if _, h := v.Tips.Current(); h != nil {
			tip = h.Round
		}
	}
	for i, gb := range f.Grants {
		m, err := gossip.DecodeLeases(gb)
		if err == nil && (m.Issuer != v.Self || m.Experiment != v.Config.Experiment.ID) {
			err = fmt.Errorf("a grant of %s in experiment %q", m.Issuer, m.Experiment)
		}
		if err != nil {
			v.Log.Warn("a grant of the previous run skipped", "file", v.grantsPath(), "entry", i, "err", err)
			continue
		}
		if m.Round > tip {
			v.grants.record(v.Self, m)
			v.ownGrants = append(v.ownGrants, m)
		}
	}
}
