package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	ma "github.com/multiformats/go-multiaddr"
	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/invite"
	"github.com/p2pnode/p2pnode/p2p"
	"github.com/p2pnode/p2pnode/status"
)

func newInviteCmd() *cobra.Command {
	var cfgPath string
	var all bool
	cmd := &cobra.Command{
		Use:   "invite [--config FILE]",
		Short: "Print the line volunteers join this experiment with",
		Long: `Print 'p2pnode join ADDR' for this validator: the addresses it can be reached at, widest
first (public, then private network; container bridges such as docker0 and loopback only
when there is nothing else, and then it says so). When the node is running, its own
addresses are used (with those its peers observed); otherwise node.listen's, which need
fixed ports ('p2pnode init --owner' writes them).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			path := cfg.Node.Identity
			if path == "" {
				path = filepath.Join(cfg.Node.StoreDir, "identity.key")
			}
			if _, err := os.Stat(path); err != nil {
				return fmt.Errorf("no identity at %s (node.identity / node.store_dir): run the node once, or 'p2pnode init --owner'", path)
			}
			key, err := p2p.LoadIdentity(path, slog.New(slog.DiscardHandler))
			if err != nil {
				return err
			}
			id, err := p2p.PeerID(key)
			if err != nil {
				return err
			}
			if !cfg.Experiment.HasRole(config.RoleValidator) || (len(cfg.Experiment.Validators) > 0 && !slices.Contains(cfg.Experiment.Validators, id)) {
				return fmt.Errorf("%s is not one of its experiment's validators (experiment.roles, experiment.validators): volunteers join through a validator, which serves the experiment's signed record", id)
			}
			addrs, from, err := inviteAddrs(cfg)
			if err != nil {
				return err
			}
			ifaces, err := invite.InterfaceIPs()
			if err != nil {
				return err
			}
			return printInvite(cmd.OutOrStdout(), id, invite.RankAddrs(addrs, ifaces), from, all)
		},
	}
	cmd.Flags().StringVarP(&cfgPath, "config", "c", "p2pnode.yaml", "the validator's experiment config")
	cmd.Flags().BoolVar(&all, "all", false, "list every address, loopback and container bridges too")
	return cmd
}

// inviteAddrs is the running node's addresses, or node.listen's on every interface.
func inviteAddrs(cfg *config.Config) ([]string, string, error) {
	if b, err := os.ReadFile(filepath.Join(cfg.Node.StoreDir, status.HTTPAddrFile)); err == nil {
		addr := strings.TrimSpace(string(b))
		client := &http.Client{Timeout: 3 * time.Second}
		if resp, err := client.Get("http://" + addr + "/status"); err == nil {
			defer resp.Body.Close()
			var st struct {
				Addrs []string `json:"addrs"`
			}
			if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&st); err == nil && len(st.Addrs) > 0 {
				return st.Addrs, "the running node's addresses", nil
			}
		}
	}
	for _, l := range cfg.Node.Listen {
		a, err := ma.NewMultiaddr(l)
		if err != nil {
			return nil, "", fmt.Errorf("node.listen %q: %w", l, err)
		}
		for _, p := range []int{ma.P_TCP, ma.P_UDP} {
			if v, err := a.ValueForProtocol(p); err == nil && v == "0" {
				return nil, "", errors.New("node.listen picks a free port (0) at each start and the node is not running: " +
					"give it fixed ports (e.g. /ip4/0.0.0.0/tcp/4001, as 'p2pnode init --owner' writes), or start it and run invite again")
			}
		}
	}
	addrs, err := invite.ListenAddrs(cfg.Node.Listen)
	return addrs, "node.listen on this machine's interfaces (the node is not running)", err
}

// printInvite prints the join line with the widest address, and the others.
func printInvite(out io.Writer, id string, ranked []invite.RankedAddr, from string, all bool) error {
	if len(ranked) == 0 {
		return fmt.Errorf("no address to invite with (%s)", from)
	}
	best := ranked[0].Reach
	fmt.Fprintf(out, "Volunteers join with (%s, reachable from %s):\n\n  p2pnode join %s/p2p/%s\n\n", from, best, ranked[0].Addr, id)
	switch best {
	case invite.ReachLoopback, invite.ReachLocal:
		fmt.Fprintf(out, "This machine has no address outside itself: only a node on this machine can join. Run the\n"+
			"validator where volunteers can reach it (a public address, or a forwarded port).\n")
	case invite.ReachPrivate:
		fmt.Fprintf(out, "That address is on a private network: volunteers outside it need a forwarded port or a\n"+
			"public address (the running node lists the addresses its peers observed, once it has peers).\n")
	}
	var others []string
	for _, r := range ranked[1:] {
		if all || r.Reach <= invite.ReachPrivate || r.Reach == best {
			others = append(others, fmt.Sprintf("  %s/p2p/%s  (%s)", r.Addr, id, r.Reach))
		}
	}
	if len(others) > 0 {
		fmt.Fprintf(out, "\nOther addresses:\n%s\n", strings.Join(others, "\n"))
	}
	return nil
}
