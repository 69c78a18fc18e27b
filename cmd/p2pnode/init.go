package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/p2p"
)

func newInitCmd() *cobra.Command {
	var dir string
	var force, owner bool
	var port int
	cmd := &cobra.Command{
		Use:   "init [--dir DIR]",
		Short: "Write a commented experiment config and a node identity",
		Long: `Write DIR/p2pnode.yaml, a config that spells out every field with its default and runs as
is (one node training the digits workload), and create the node's identity key
(DIR/.p2pnode/identity.key, mode 0600). An existing config is kept unless --force.

With --owner the config is an experiment's first validator: its own peer id in
experiment.validators, the bootstrap role, and fixed ports (--port, TCP and QUIC) that
volunteers can be given; 'p2pnode invite' then prints the line they join with.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			path := filepath.Join(dir, "p2pnode.yaml")
			if _, err := os.Stat(path); err == nil && !force {
				return fmt.Errorf("%s exists; use --force to overwrite it", path)
			} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			if err := os.WriteFile(path, config.Template, 0o644); err != nil {
				return err
			}
			cfg, err := config.Load(path)
			if err != nil {
				return fmt.Errorf("the written config does not load (a bug): %w", err)
			}
			key, err := p2p.LoadIdentity(filepath.Join(cfg.Node.StoreDir, "identity.key"), slog.New(slog.DiscardHandler))
			if err != nil {
				return err
			}
			id, err := p2p.PeerID(key)
			if err != nil {
				return err
			}
			if owner {
				text, err := ownerTemplate(config.Template, id, port)
				if err != nil {
					return err
				}
				if err := os.WriteFile(path, text, 0o644); err != nil {
					return err
				}
			}
			cfg, err = config.Load(path)
			if err != nil {
				return fmt.Errorf("the written config does not load (a bug): %w", err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "wrote %s\npeer id %s\nrun it with: p2pnode run --config %s\n", path, id, path)
			if owner {
				fmt.Fprintf(out, "then print the line volunteers join with: p2pnode invite --config %s\n", path)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".", "directory for p2pnode.yaml and the store")
	cmd.Flags().BoolVar(&force, "force", false, "overwrite an existing p2pnode.yaml")
	cmd.Flags().BoolVar(&owner, "owner", false, "an experiment's validator: own peer id in experiment.validators, bootstrap role, fixed ports")
	cmd.Flags().IntVar(&port, "port", 4001, "with --owner: the TCP and UDP (QUIC) port to listen on")
	return cmd
}

// ownerTemplate edits the template into an owner's config: validators, roles and ports.
// The template's comments stay; each edit must find its line.
func ownerTemplate(tmpl []byte, id string, port int) ([]byte, error) {
	if port <= 0 || port > 65535 {
		return nil, fmt.Errorf("--port: %d is not a port (1-65535)", port)
	}
	text := string(tmpl)
	for _, r := range [][2]string{
		{"    - /ip4/0.0.0.0/tcp/0\n    - /ip4/0.0.0.0/udp/0/quic-v1\n", fmt.Sprintf("    - /ip4/0.0.0.0/tcp/%d\n    - /ip4/0.0.0.0/udp/%d/quic-v1\n", port, port)},
		{"  roles: [validator, trainer]\n", "  roles: [validator, bootstrap, trainer]\n"},
		{"  validators: []\n", fmt.Sprintf("  validators: [%s]\n", id)},
	} {
		if strings.Count(text, r[0]) != 1 {
			return nil, fmt.Errorf("init --owner: the template has no single line %q to edit (a bug)", strings.TrimSpace(r[0]))
		}
		text = strings.Replace(text, r[0], r[1], 1)
	}
	return []byte(text), nil
}
