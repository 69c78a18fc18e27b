package node

import (
	"log/slog"
	"slices"
	"sync"

	"github.com/ipfs/go-cid"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/dataset"
	"github.com/p2pnode/p2pnode/invite"
	"github.com/p2pnode/p2pnode/pack"
)

// inviteModule serves the experiment's record (invite) from a validator that the config
// names as one, so that `p2pnode join` can fetch it from this node.
func inviteModule(cfg *config.Config) fx.Option {
	if !cfg.Experiment.HasRole(config.RoleValidator) {
		return fx.Options()
	}
	return fx.Module("invite",
		fx.Invoke(func(lc fx.Lifecycle, h host.Host, key crypto.PrivKey, self peer.ID, tips *chain.Tips, store *artifact.Store, log *slog.Logger) error {
			if !slices.Contains(validatorSet(cfg, self), self.String()) {
				log.With("pkg", "invite").Debug("not serving the experiment record: this node is not in experiment.validators")
				return nil
			}
			exp, err := invite.Experiment(cfg, self.String())
			if err != nil {
				return err
			}
			r, err := invite.Sign(key, exp)
			if err != nil {
				return err
			}
			var s *invite.Server
			lc.Append(fx.StartStopHook(func() error {
				s, err = invite.Serve(h, r, log.With("pkg", "invite"))
				if err == nil {
					s.SetSizes(newSizer(cfg, tips, store).sizes)
					log.With("pkg", "invite").Debug("serving the experiment record", "experiment", invite.ID(exp).String())
				}
				return err
			}, func() {
				if s != nil {
					s.Close()
				}
			}))
			return nil
		}),
	)
}

// sizer answers what a joining node will download (invite.Sizes): the canonical head's
// parameter pack, as this node stores it, and the dataset its manifest lists. The
// numbers of a head are worked out once.
type sizer struct {
	cfg   *config.Config
	tips  *chain.Tips
	store *artifact.Store

	mu       sync.Mutex
	head     cid.Cid
	last     invite.Sizes
	haveData bool
}

func newSizer(cfg *config.Config, tips *chain.Tips, store *artifact.Store) *sizer {
	return &sizer{cfg: cfg, tips: tips, store: store}
}

func (z *sizer) sizes() (invite.Sizes, bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if !z.haveData {
		if m, err := dataset.Load(z.cfg.Dataset.Manifest); err == nil {
			for _, f := range m.Files {
				z.last.DatasetBytes += uint64(f.Bytes)
			}
			z.last.DatasetFiles = uint64(len(m.Files))
			z.haveData = true
		}
	}
	id, h := z.tips.Current()
	if h != nil && id != z.head {
		if pid, err := h.ParamsID(); err == nil {
			if m, err := z.store.Manifest(pid); err == nil {
				z.head = id
				z.last.Round, z.last.ParamsBytes, z.last.Params = h.Round, m.Size, pack.ParamCount(z.store.BlobPath(pid))
			}
		}
	}
	return z.last, z.head.Defined() || z.haveData
}
