package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/export"
	"github.com/p2pnode/p2pnode/pyruntime"
)

// env is what every role loop shares.
type env struct {
	cfg        *config.Config
	log        *slog.Logger
	self       string
	key        crypto.PrivKey
	host       host.Host
	bus        Bus
	tips       *tips
	store      *artifact.Store
	heads      *chain.Store
	rt         pyruntime.Runtime // nil when the node runs no workload
	data       *dataState
	status     *statusBoard
	keeper     *keeper
	validators []string // peers whose signatures make a head canonical
	progress   io.Writer
	metrics    *nodeMetrics
	peers      *peerRounds    // rounds announced by peers
	poison     string         // fault injection mode (tests); "" for an honest node
	exporter   *export.Writer // keeps export.dir current; nil when export is off
}

func (e *env) isValidator(p string) bool { return slices.Contains(e.validators, p) }

// done reports whether the experiment's round limit is reached.
func (e *env) done() bool {
	_, h := e.tips.Current()
	return h != nil && e.cfg.Experiment.Rounds > 0 && h.Round >= uint64(e.cfg.Experiment.Rounds)
}

// headArtifacts lists the artifacts of h this node needs: the parameters always, the
// outer optimizer state only on a validator, which merges from it. A trainer trains on the
// parameters alone; fetching the momentum too doubled its download every round (2.2× the
// fp32 model received per round, measured on the WAN harness).
func (e *env) headArtifacts(h *chain.Head) []func() (cid.Cid, error) {
	if e.cfg.Experiment.HasRole(config.RoleValidator) {
		return []func() (cid.Cid, error){h.ParamsID, h.OuterStateID}
	}
	return []func() (cid.Cid, error){h.ParamsID}
}

// fetchHeadArtifacts makes sure the artifacts a head needs to be trained on or merged from
// (see headArtifacts) are in the local store, before the head can become canonical here.
func (e *env) fetchHeadArtifacts(ctx context.Context, h *chain.Head, hints ...peer.ID) error {
	for _, get := range e.headArtifacts(h) {
		id, err := get()
		if err != nil {
			return err
		}
		if !id.Defined() || e.store.Has(id) {
			continue
		}
		if err := e.bus.Fetch(ctx, id, hints...); err != nil {
			return fmt.Errorf("head round %d: fetch %s: %w", h.Round, id, err)
		}
	}
	return nil
}
