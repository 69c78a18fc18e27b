package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/internal/atomicfile"
	"github.com/p2pnode/p2pnode/internal/progress"
	"github.com/p2pnode/p2pnode/invite"
	"github.com/p2pnode/p2pnode/node"
	"github.com/p2pnode/p2pnode/p2p"
)

// Files `join` keeps in its directory.
const (
	joinConfigFile = "p2pnode.yaml"
	joinRecordFile = "experiment.record" // the verified record the config was written from
)

type joinFlags struct {
	dir, device, store, http string
	listen                   []string
	update, noRun, noDoctor  bool
}

func newJoinCmd(g *globalFlags) *cobra.Command {
	f := &joinFlags{}
	build := nodeBuilder(node.New)
	cmd := &cobra.Command{
		Use:   "join ADDR",
		Short: "Join an experiment from one of its validators' addresses",
		Long: `Dial the validator in ADDR (a multiaddr ending in /p2p/<peer id>, as 'p2pnode invite'
prints it), fetch the experiment's shared config, check that a validator it names signed it
and that this validator is the peer dialed, write DIR/p2pnode.yaml (the experiment's keys and
this node's own: store, ports, device), check the machine ('p2pnode doctor'), say what it
is about to do, and train.

Run again, it reuses DIR's config and identity. When the experiment has changed since (its
id, the CID of the shared config, differs), it stops and lists what changed: --update
accepts the new experiment. Any config key can be overridden with an environment variable
named after its path (P2PNODE_NODE_LISTEN, P2PNODE_WORKLOAD_DEVICE), for containers.`,
		Example: "  p2pnode join /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW...",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := joinExperiment(cmd.Context(), args[0], f, cmd.OutOrStdout())
			if err != nil || f.noRun {
				return err
			}
			return runConfig(cmd, g, cfg, build, nil) // the node prints the dashboard's URL
		},
	}
	cmd.Flags().StringVar(&f.dir, "dir", ".", "directory for this node's p2pnode.yaml, experiment record and (by default) store")
	cmd.Flags().StringVar(&f.device, "device", "", "workload.device: auto (default), cpu, cuda, cuda:N, mps")
	cmd.Flags().StringVar(&f.store, "store", "", "node.store_dir (default DIR/.p2pnode)")
	cmd.Flags().StringSliceVar(&f.listen, "listen", nil, "node.listen multiaddrs (default: any port, TCP and QUIC)")
	cmd.Flags().StringVar(&f.http, "http", "", "node.http: the status and dashboard address (default 127.0.0.1, any port)")
	cmd.Flags().BoolVar(&f.update, "update", false, "accept an experiment that changed since this directory joined it")
	cmd.Flags().BoolVar(&f.noDoctor, "no-doctor", false, "skip the machine's checks ('p2pnode doctor') before joining")
	cmd.Flags().BoolVar(&f.noRun, "no-run", false, "write the config and stop (start it later with 'p2pnode run --config DIR/p2pnode.yaml')")
	for _, hook := range runHooks {
		hook(cmd, &build)
	}
	return cmd
}

// parseJoinAddr reads ADDR: a multiaddr with the validator's peer id.
func parseJoinAddr(s string) (peer.AddrInfo, error) {
	a, err := ma.NewMultiaddr(s)
	if err != nil {
		return peer.AddrInfo{}, fmt.Errorf("join address %q: %w", s, err)
	}
	info, err := peer.AddrInfoFromP2pAddr(a)
	if err != nil {
		return peer.AddrInfo{}, fmt.Errorf("join address %q has no /p2p/<peer id>: without it the validator cannot be checked; use the line 'p2pnode invite' prints on the experiment's validator", s)
	}
	if len(info.Addrs) == 0 {
		return peer.AddrInfo{}, fmt.Errorf("join address %q names a peer but no address to dial it at (/ip4/…/tcp/PORT/p2p/ID)", s)
	}
	return *info, nil
}

// joinExperiment fetches and checks the record, writes (or reuses) the local config and
// returns it loaded. Nothing is written unless the record verifies and the config loads.
func joinExperiment(ctx context.Context, addr string, f *joinFlags, out io.Writer) (*config.Config, error) {
	info, err := parseJoinAddr(addr)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(f.dir, joinConfigFile)
	recPath := filepath.Join(f.dir, joinRecordFile)
	prev, prevRec, err := loadJoined(cfgPath, recPath)
	if err != nil {
		return nil, err
	}
	local := joinLocal(prev, f, addr)
	absDir, err := filepath.Abs(f.dir)
	if err != nil {
		return nil, err
	}
	keyPath, err := joinKeyPath(prev, local, absDir)
	if err != nil {
		return nil, err
	}
	key, newKey, err := joinIdentity(keyPath)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "fetching the experiment from %s …\n", info.ID)
	rec, sizes, err := invite.FetchFrom(ctx, key, info)
	if err != nil {
		if prev != nil && prevRec != nil {
			fmt.Fprintf(out, "could not reach %s (%v): starting with the experiment joined before (%s)\n", info.ID, err, invite.ID(prevRec.Experiment))
			return config.Load(cfgPath)
		}
		return nil, err
	}
	j, err := invite.Verify(rec, info.ID)
	if err != nil {
		return nil, fmt.Errorf("refused the experiment record from %s: %w; nothing was written", info.ID, err)
	}
	if prevRec != nil && invite.ID(prevRec.Experiment) != j.ID && !f.update {
		changes := invite.Diff(prevRec.Experiment, rec.Experiment)
		return nil, fmt.Errorf("experiment changed since %s joined it (%s → %s):\n  %s\nrun again with --update to accept it; nothing was written",
			f.dir, invite.ID(prevRec.Experiment), j.ID, strings.Join(changes, "\n  "))
	}
	if local.DatasetRoot == "" {
		local.DatasetRoot = filepath.Join("data", j.Config.Experiment.ID)
	}
	text, err := invite.LocalConfig(rec.Experiment, rec.Signer, local)
	if err != nil {
		return nil, err
	}
	cfg, err := config.Parse(text)
	if err == nil {
		cfg.Resolve(absDir)
		err = cfg.Validate()
	}
	if err != nil {
		return nil, fmt.Errorf("the experiment from %s does not make a valid config here: %w; nothing was written", info.ID, err)
	}
	if !f.noDoctor {
		if _, err := cfg.ApplyEnv(os.Environ()); err != nil {
			return nil, fmt.Errorf("environment: %w", err)
		}
		cfg.Resolve(absDir)
		cfg.Path = filepath.Join(absDir, joinConfigFile)
		if runDoctor(ctx, cfg, out) {
			return nil, fmt.Errorf("this machine cannot run the experiment yet: fix what doctor says FAIL above and run join again; nothing was written")
		}
	}
	encoded, err := invite.Encode(rec)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	if newKey != nil {
		if err := os.MkdirAll(filepath.Dir(keyPath), 0o700); err != nil {
			return nil, fmt.Errorf("write identity %s: %w", keyPath, err)
		}
		if err := atomicfile.Write(keyPath, newKey, 0o600); err != nil {
			return nil, fmt.Errorf("write identity %s: %w", keyPath, err)
		}
	}
	if err := atomicfile.Write(recPath, encoded, 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", recPath, err)
	}
	if err := atomicfile.Write(cfgPath, text, 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", cfgPath, err)
	}
	loaded, err := config.Load(cfgPath)
	if err != nil {
		return nil, err
	}
	printJoinPlan(out, j, sizes, loaded, cfgPath, prevRec)
	return loaded, nil
}

// loadJoined reads a directory's earlier join: its config file (raw, unresolved, for the
// node-local settings) and record. A config that join did not write is refused.
func loadJoined(cfgPath, recPath string) (*config.Config, *invite.Record, error) {
	b, err := os.ReadFile(cfgPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", cfgPath, err)
	}
	rb, err := os.ReadFile(recPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("%s exists but was not written by join (no %s beside it): use another --dir, or 'p2pnode run --config %s'", cfgPath, joinRecordFile, cfgPath)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", recPath, err)
	}
	rec, err := invite.Decode(rb)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", recPath, err)
	}
	cfg, err := config.Parse(b)
	if err != nil {
		return nil, nil, fmt.Errorf("config %s: %w", cfgPath, err)
	}
	return cfg, rec, nil
}

// joinLocal is the node-local settings: the earlier join's (as written, relative paths and
// all), else the defaults, with the flags over them.
func joinLocal(prev *config.Config, f *joinFlags, addr string) invite.Local {
	d := config.Default()
	l := invite.Local{StoreDir: d.Node.StoreDir, Listen: d.Node.Listen, HTTP: d.Node.HTTP, Bootstrap: []string{addr},
		Roles: []string{config.RoleTrainer}, Device: d.Workload.Device}
	if prev != nil {
		l = invite.Local{StoreDir: prev.Node.StoreDir, Listen: prev.Node.Listen, HTTP: prev.Node.HTTP, Bootstrap: prev.Node.Bootstrap,
			Roles: prev.Experiment.Roles, Device: prev.Workload.Device, DatasetRoot: prev.Dataset.Root}
		if !contains(l.Bootstrap, addr) {
			l.Bootstrap = append(l.Bootstrap, addr)
		}
	}
	if f.store != "" {
		l.StoreDir = f.store
	}
	if len(f.listen) > 0 {
		l.Listen = f.listen
	}
	if f.http != "" {
		l.HTTP = f.http
	}
	if f.device != "" {
		l.Device = f.device
	}
	return l
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// joinKeyPath is where the node's identity key is: node.identity, else in node.store_dir,
// as the node will run (environment overrides included).
func joinKeyPath(prev *config.Config, local invite.Local, dir string) (string, error) {
	c := config.Default()
	c.Node.StoreDir = local.StoreDir
	if prev != nil {
		c.Node.Identity = prev.Node.Identity
	}
	if _, err := c.ApplyEnv(os.Environ()); err != nil {
		return "", fmt.Errorf("environment: %w", err)
	}
	c.Resolve(dir)
	if c.Node.Identity != "" {
		return c.Node.Identity, nil
	}
	return filepath.Join(c.Node.StoreDir, "identity.key"), nil
}

// joinIdentity reads the node's key, or makes one in memory (returned encoded, to be
// written only once the join succeeds).
func joinIdentity(path string) (crypto.PrivKey, []byte, error) {
	if _, err := os.Stat(path); err == nil {
		k, err := p2p.LoadIdentity(path, slog.New(slog.DiscardHandler))
		return k, nil, err
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("identity %s: %w", path, err)
	}
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate identity: %w", err)
	}
	raw, err := crypto.MarshalPrivateKey(k)
	if err != nil {
		return nil, nil, fmt.Errorf("encode identity: %w", err)
	}
	return k, raw, nil
}

// printJoinPlan says what the node is about to do, with the sizes the validator reported
// (nil: it reported none).
func printJoinPlan(out io.Writer, j *invite.Joined, sz *invite.Sizes, cfg *config.Config, cfgPath string, prev *invite.Record) {
	e := cfg.Experiment
	fmt.Fprintf(out, "experiment  %s/%s  %s\n", e.Network, e.ID, j.ID)
	fmt.Fprintf(out, "            signed by validator %s (the peer dialed); %d validator(s), quorum %d\n", j.Record.Signer, len(e.Validators), e.Quorum)
	rounds := fmt.Sprintf("%d rounds", e.Rounds)
	if e.Rounds == 0 {
		rounds = "until stopped"
	}
	fmt.Fprintf(out, "training    %s, %s merges, %d inner steps a round, codec %s\n", rounds, cfg.Protocol.MergePolicy, cfg.Protocol.InnerSteps, cfg.Protocol.Codec)
	model := cfg.Workload.Factory
	if len(cfg.Workload.Config) > 0 {
		model += fmt.Sprintf(" %v", cfg.Workload.Config)
	}
	fmt.Fprintf(out, "model       %s\n", model)
	if sz != nil && sz.ParamsBytes > 0 {
		count := "parameters"
		if sz.Params > 0 {
			count = progress.Count(sz.Params) + " parameters"
		}
		fmt.Fprintf(out, "            %s, %s to download (the head of round %d)\n", count, progress.Bytes(sz.ParamsBytes), sz.Round)
	}
	data := "from peers, verified by CID"
	if cfg.Dataset.Prepare {
		data = "prepared here by the workload when missing"
	}
	fmt.Fprintf(out, "dataset     %s (%s)\n", cfg.Dataset.Root, data)
	if sz != nil && sz.DatasetFiles > 0 {
		fmt.Fprintf(out, "            %s in %d files\n", progress.Bytes(sz.DatasetBytes), sz.DatasetFiles)
	}
	writeJoinSizes(out, sz, cfg)
	fmt.Fprintf(out, "device      %s; store %s\n", cfg.Workload.Device, cfg.Node.StoreDir)
	switch {
	case prev == nil:
		fmt.Fprintf(out, "config      wrote %s\n", cfgPath)
	case invite.ID(prev.Experiment) != j.ID:
		fmt.Fprintf(out, "config      updated %s to the new experiment\n", cfgPath)
	default:
		fmt.Fprintf(out, "config      %s (the experiment is unchanged)\n", cfgPath)
	}
}

// writeJoinSizes says how much the node downloads and keeps on disk: the parameters of a
// head, the dataset unless the workload prepares it here, and node.keep_heads heads'
// parameters in the store. On the sparse codec a trainer also downloads a head's outer
// state (it rebuilds the next heads from their updates) and keeps the tip's and the
// anchor head's (upkeep.AnchorEvery) beside the anchor's parameters: 3 packs more.
func writeJoinSizes(out io.Writer, sz *invite.Sizes, cfg *config.Config) {
	if sz == nil || (sz.ParamsBytes == 0 && sz.DatasetFiles == 0) {
		fmt.Fprintf(out, "download    size not reported by the validator (it runs an older p2pnode, or has no head yet)\n")
		return
	}
	download, parts := sz.ParamsBytes, "the parameters"
	packs, kept := uint64(cfg.Node.KeepHeads), fmt.Sprintf("node.keep_heads=%d heads' parameters", cfg.Node.KeepHeads)
	if cfg.Protocol.Codec == diloco.Sparse {
		download, parts = 2*sz.ParamsBytes, "the parameters and outer state"
		packs, kept = packs+3, kept+", the tip's outer state and the anchor head's parameters and outer state"
	}
	if !cfg.Dataset.Prepare && sz.DatasetFiles > 0 {
		download += sz.DatasetBytes
		parts += " and the dataset"
	}
	disk := sz.DatasetBytes + packs*sz.ParamsBytes
	fmt.Fprintf(out, "download    %s (%s); disk needed about %s (the dataset and %s)\n",
		progress.Bytes(download), parts, progress.Bytes(disk), kept)
}
