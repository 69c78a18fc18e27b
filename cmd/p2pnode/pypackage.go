package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/pyruntime"
)

func newPythonPackageCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "python-package --out DIR",
		Short: "Write the p2ptrain Python package this binary embeds, ready for pip",
		Long: `Writes the p2ptrain package embedded in this binary (with its pyproject.toml) into DIR,
so that it can be installed into a virtual environment next to your workload package:

  p2pnode python-package --out p2ptrain-src
  python3 -m venv --system-site-packages V
  V/bin/pip install --no-build-isolation --no-deps --no-index ./p2ptrain-src

Then set workload.interpreter: V/bin/python. A p2ptrain installed for the interpreter is
used in place of the embedded copy; it must speak this node's worker protocol.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return fmt.Errorf("--out: a directory to write the package into is required")
			}
			if err := pyruntime.WritePackage(out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote p2ptrain %s to %s\ninstall it with: pip install --no-build-isolation --no-deps --no-index %s\n",
				pyruntime.EmbeddedVersion(), out, out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory to write the package into (created if missing)")
	return cmd
}
