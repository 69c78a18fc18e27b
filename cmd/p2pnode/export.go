package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/export"
	"github.com/p2pnode/p2pnode/node"
)

func newExportCmd(g *globalFlags) *cobra.Command {
	var cfgPath, head, out string
	var shardBytes int64
	var blockBytes int
	var inPlace, asJSON, modelConfig bool
	cmd := &cobra.Command{
		Use:   "export --config FILE --head CID|latest --out DIR [--in-place] [--shard-bytes N] [--block-bytes N]",
		Short: "Write a head's parameters as a safetensors model directory",
		Long: `Write the parameters of a head as an ordinary model directory that any safetensors reader
loads: model.safetensors, or above --shard-bytes of tensor data the shards
model-00001-of-0000N.safetensors plus model.safetensors.index.json. Tensor names and shapes
are the workload's state-dict names; each file's __metadata__ names the network, experiment,
round, head and params CIDs. The same head always gives byte-identical files.

With --in-place, a model of the same layout already in DIR is compared block by block and
only the blocks that differ are rewritten, through a journal: a crash at any moment leaves
the old model or the new one, never a mix (the next export or verify of DIR finishes or
rolls back the interrupted sync). A model of another layout is an error and nothing is written; without a
model in DIR the whole model is written.

Without --in-place every file is written to a temp file and renamed into place together.
Other files in DIR are left alone; stale model files of an earlier export are removed.

When the workload provides a model config (the lm workload does: its layers, width, heads,
context), config.json is written beside the safetensors; python3 -m p2ptrain.sample
generates text from such a directory. Asking the workload runs the config's Python
interpreter; if that fails, the model is still exported and a warning says why
(--model-config=false skips it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			o, err := newOutputs(g, cfg.Node.LogLevel, cmd.OutOrStdout(), os.Stderr)
			if err != nil {
				return err
			}
			log := o.log
			if out == "" {
				out = cfg.Export.Dir
			}
			if out == "" {
				return errors.New("--out: no directory given (and export.dir is empty in the config)")
			}
			if !cmd.Flags().Changed("shard-bytes") {
				shardBytes = cfg.Export.ShardBytes
			}
			if !cmd.Flags().Changed("block-bytes") {
				blockBytes = cfg.Export.BlockBytes
			}
			if shardBytes <= 0 {
				return fmt.Errorf("--shard-bytes: %d must be positive", shardBytes)
			}
			st, id, err := openHead(cfg, head)
			if err != nil {
				return err
			}
			src, err := export.OpenHead(st.Artifacts, st.Heads, id)
			if err != nil {
				return err
			}
			defer src.Close()
			rep, err := export.Export(cmd.Context(), src, out, export.Options{
				InPlace: inPlace, ShardBytes: shardBytes, BlockBytes: blockBytes, Log: log, Progress: o.work,
			})
			if err != nil {
				return err
			}
			wroteConfig := false
			if modelConfig {
				if wroteConfig, err = writeModelConfig(cmd, cfg, out, log); err != nil {
					return err
				}
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			rep.Print(cmd.OutOrStdout())
			if wroteConfig {
				fmt.Fprintf(cmd.OutOrStdout(), "  %s: the model config of workload %s\n", export.ConfigFile, cfg.Workload.Factory)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&cfgPath, "config", "c", "p2pnode.yaml", "experiment config file (its store holds the head)")
	cmd.Flags().StringVar(&head, "head", "latest", "head CID to export, or latest (the node's newest canonical head)")
	cmd.Flags().StringVarP(&out, "out", "o", "", "model directory to write (default: the config's export.dir)")
	cmd.Flags().BoolVar(&inPlace, "in-place", false, "rewrite only the blocks that changed in the model already in --out")
	cmd.Flags().Int64Var(&shardBytes, "shard-bytes", 0, "split into shards above this many bytes of tensors (default: the config's export.shard_bytes)")
	cmd.Flags().IntVar(&blockBytes, "block-bytes", 0, "block size compared and rewritten in place (default: the config's export.block_bytes)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.Flags().BoolVar(&modelConfig, "model-config", true, "also write the workload's model config as config.json (runs Python)")
	return cmd
}

// writeModelConfig writes out/config.json when the workload has a model config. A workload
// that cannot be asked (no Python here, say) is a warning: the safetensors are exported.
func writeModelConfig(cmd *cobra.Command, cfg *config.Config, out string, log *slog.Logger) (bool, error) {
	if cfg.Workload.Factory == "" {
		return false, nil
	}
	mc, err := node.ModelConfig(cmd.Context(), cfg, log)
	if err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s not written: workload %s: %v\n", filepath.Join(out, export.ConfigFile), cfg.Workload.Factory, err)
		return false, nil
	}
	if mc == nil {
		return false, nil
	}
	return true, export.WriteModelConfig(out, mc)
}

func newVerifyCmd(g *globalFlags) *cobra.Command {
	var cfgPath, head, dir string
	cmd := &cobra.Command{
		Use:   "verify --config FILE --head CID|latest [--dir DIR]",
		Short: "Re-hash a head's parameters, and check an exported model directory against them",
		Long: `Recompute the parameter hash of a head: every chunk of its params artifact against the
artifact's manifest (and the manifest against the artifact id), then the pack's layout hash
against the head's. With --dir, also check that the model directory holds exactly the
head's tensors (names, F32 shapes, and the sha256 of every tensor's bytes equal to the
pack's); an interrupted export of DIR is recovered first.

Prints OK lines, or what is wrong and exits non-zero.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			log, err := newLogger(g, cfg.Node.LogLevel, os.Stderr)
			if err != nil {
				return err
			}
			st, id, err := openHead(cfg, head)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			hc, err := export.VerifyHead(st.Artifacts, st.Heads, id)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "OK   head %s round %d\n", hc.Head, hc.Round)
			fmt.Fprintf(w, "OK   params %s: %d chunks, %s re-hashed against the manifest\n", hc.Params, hc.Chunks, export.HumanBytes(int64(hc.Size)))
			fmt.Fprintf(w, "OK   layout %s: %d tensors, %d parameters, as the head says\n", hc.LayoutHash, hc.Tensors, hc.Parameters)
			if dir == "" {
				return nil
			}
			src, err := export.OpenHead(st.Artifacts, st.Heads, id)
			if err != nil {
				return err
			}
			defer src.Close()
			dc, err := export.VerifyDir(dir, src, log)
			if dc != nil {
				if dc.Recovered != export.RecoveryNone {
					fmt.Fprintf(w, "NOTE %s: an interrupted export was recovered first (journal %s)\n", dir, dc.Recovered)
				}
				for _, n := range dc.Notes {
					fmt.Fprintf(w, "NOTE %s\n", n)
				}
				for _, p := range dc.Problems {
					fmt.Fprintf(w, "BAD  %s\n", p)
				}
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "OK   %s: %d tensors in %d files equal the head's\n", dir, dc.Tensors, len(dc.Files))
			return nil
		},
	}
	cmd.Flags().StringVarP(&cfgPath, "config", "c", "p2pnode.yaml", "experiment config file (its store holds the head)")
	cmd.Flags().StringVar(&head, "head", "latest", "head CID to verify, or latest")
	cmd.Flags().StringVar(&dir, "dir", "", "also check this exported model directory against the head")
	return cmd
}
