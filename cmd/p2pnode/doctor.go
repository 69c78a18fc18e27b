package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/doctor"
)

func newDoctorCmd() *cobra.Command {
	var cfgPath string
	cmd := &cobra.Command{
		Use:   "doctor [--config FILE]",
		Short: "Check that this machine can run a node, and say how to fix what is missing",
		Long: `Check the interpreter and torch (naming the interpreter the node will use), CUDA and the
device, free disk for the store and dataset, memory, /dev/shm, the ports, the bootstrap
peers, and whether this machine is reachable from outside (AutoNAT: a bootstrap peer,
validators first, is asked to dial it back; behind a NAT the node works through relays and
hole punching, and doctor says which port to forward), for the config given (default:
p2pnode.yaml when it exists, else the defaults). Each failed check prints its fix. doctor
changes nothing: it runs the interpreter once, binds each fixed port for an instant, and
asks the peer from a short-lived libp2p host with a fresh key. The exit status is 1 when a
check failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := doctorConfig(cfgPath, cmd.Flags().Changed("config"))
			if err != nil {
				return err
			}
			if runDoctor(cmd.Context(), cfg, cmd.OutOrStdout()) {
				return errSilent
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&cfgPath, "config", "c", "p2pnode.yaml", "experiment config file")
	return cmd
}

// doctorConfig loads the config to check: the file, or the defaults when none was asked
// for and p2pnode.yaml is not here.
func doctorConfig(path string, asked bool) (*config.Config, error) {
	if _, err := os.Stat(path); !asked && errors.Is(err, fs.ErrNotExist) {
		cfg := config.Default()
		if _, err := cfg.ApplyEnv(os.Environ()); err != nil {
			return nil, fmt.Errorf("environment: %w", err)
		}
		wd, err := os.Getwd()
		if err != nil {
			return nil, err
		}
		cfg.Resolve(wd)
		return cfg, cfg.Validate()
	}
	return config.Load(path)
}

// runDoctor prints each check and reports whether one failed.
func runDoctor(ctx context.Context, cfg *config.Config, out io.Writer) bool {
	where := "the defaults"
	if cfg.Path != "" {
		where = filepath.Base(cfg.Path)
	}
	fmt.Fprintf(out, "doctor: this machine for %s\n", where)
	rs := doctor.System().Run(ctx, cfg)
	for _, r := range rs {
		fmt.Fprintf(out, "  %-4s  %-11s  %s\n", r.Status, r.Name, r.Detail)
		if r.Fix != "" {
			fmt.Fprintf(out, "  %-4s  %-11s  fix: %s\n", "", "", r.Fix)
		}
	}
	return doctor.Failed(rs)
}
