package node

import (
	"log/slog"
	"slices"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/invite"
)

// inviteModule serves the experiment's record (invite) from a validator that the config
// names as one, so that `p2pnode join` can fetch it from this node.
func inviteModule(cfg *config.Config) fx.Option {
	if !cfg.Experiment.HasRole(config.RoleValidator) {
		return fx.Options()
	}
	return fx.Module("invite",
		fx.Invoke(func(lc fx.Lifecycle, h host.Host, key crypto.PrivKey, self peer.ID, log *slog.Logger) error {
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
