package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/p2p"
)

func newInitCmd() *cobra.Command {
	var dir string
	var force bool
	cmd := &cobra.Command{
		Use:   "init [--dir DIR]",
		Short: "Write a commented experiment config and a node identity",
		Long: `Write DIR/p2pnode.yaml, a config that spells out every field with its default and runs as
is (one node training the digits workload), and create the node's identity key
(DIR/.p2pnode/identity.key, mode 0600). An existing config is kept unless --force.`,
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
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "wrote %s\npeer id %s\nrun it with: p2pnode run --config %s\n", path, id, path)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".", "directory for p2pnode.yaml and the store")
	cmd.Flags().BoolVar(&force, "force", false, "overwrite an existing p2pnode.yaml")
	return cmd
}
