package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/dataset"
	"github.com/p2pnode/p2pnode/node"
)

func newDatasetCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dataset",
		Short: "Build, prepare and inspect datasets",
	}
	var name string
	var chunk int
	build := &cobra.Command{
		Use:   "build DIR",
		Short: "Write DIR/manifest.json listing DIR's files with their CIDs",
		Long: `Hash every file under DIR (hidden files skipped) into DIR/manifest.json: path, size,
example count (from an optional examples.json sidecar) and artifact CID. Every node of an
experiment must use the same --chunk-size as its node.chunk_size.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			if name == "" {
				name = filepath.Base(filepath.Clean(dir))
			}
			m, err := dataset.Build(dir, name, chunk)
			if err != nil {
				return err
			}
			path := filepath.Join(dir, dataset.ManifestFile)
			if err := m.Write(path); err != nil {
				return err
			}
			id, err := m.ID()
			if err != nil {
				return err
			}
			var bytes, examples int64
			for _, f := range m.Files {
				bytes += f.Bytes
				examples += f.Examples
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d files, %d bytes, %d examples, id %s\n", path, len(m.Files), bytes, examples, id)
			return nil
		},
	}
	build.Flags().StringVar(&name, "name", "", "dataset name (default: the directory's name)")
	build.Flags().IntVar(&chunk, "chunk-size", 1<<20, "artifact chunk size the CIDs are computed with")

	var cfgPath string
	prepare := &cobra.Command{
		Use:   "prepare --config FILE",
		Short: "Let the config's workload write its dataset, then build the manifest",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			o, err := newOutputs(g, cfg.Node.LogLevel, cmd.OutOrStdout(), os.Stderr)
			if err != nil {
				return err
			}
			plan, err := node.PrepareDataset(cmd.Context(), cfg, o.work, o.log)
			if err != nil {
				return err
			}
			fmt.Fprintf(o.out, "dataset %s ready: %d microshards of about %d bytes\n", cfg.Dataset.Manifest, len(plan.Shards), plan.TargetBytes)
			return nil
		},
	}
	prepare.Flags().StringVarP(&cfgPath, "config", "c", "p2pnode.yaml", "experiment config file")

	plan := &cobra.Command{
		Use:   "plan --config FILE",
		Short: "Print the microshard plan of the config's dataset as JSON",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			m, err := dataset.Load(cfg.Dataset.Manifest)
			if err != nil {
				return err
			}
			p, err := dataset.NewPlan(m, cfg.Dataset.MicroshardBytes)
			if err != nil {
				return err
			}
			type shard struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Files    []int  `json:"files"`
				Bytes    int64  `json:"bytes"`
				Examples int64  `json:"examples"`
			}
			out := struct {
				ID     string  `json:"id"`
				Shards []shard `json:"microshards"`
			}{ID: p.ID().String()}
			for _, s := range p.Shards {
				out.Shards = append(out.Shards, shard{s.Index, s.ID.String(), s.Files, s.Bytes, s.Examples})
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(out)
		},
	}
	plan.Flags().StringVarP(&cfgPath, "config", "c", "p2pnode.yaml", "experiment config file")
	cmd.AddCommand(build, prepare, plan)
	return cmd
}
