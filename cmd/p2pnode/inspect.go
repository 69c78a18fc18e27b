package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/internal/version"
	"github.com/p2pnode/p2pnode/node"
	"github.com/p2pnode/p2pnode/status"
)

func newStatusCmd() *cobra.Command {
	var addr, cfgPath string
	var raw bool
	cmd := &cobra.Command{
		Use:   "status [--config FILE | --addr HOST:PORT]",
		Short: "Show a running node's status",
		Long: `Read /status from a running node: by --addr, or by --config (the node writes its bound
HTTP address to <store_dir>/http.addr when it starts).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg *config.Config
			if addr == "" {
				var err error
				if cfg, err = config.Load(cfgPath); err != nil {
					return err
				}
				b, err := os.ReadFile(filepath.Join(cfg.Node.StoreDir, status.HTTPAddrFile))
				if errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("the node of %s is not running (it stopped, or never started: no %s in %s)%s",
						cfgPath, status.HTTPAddrFile, cfg.Node.StoreDir, lastHead(cfg))
				}
				if err != nil {
					return fmt.Errorf("find the node of %s: %w", cfgPath, err)
				}
				addr = strings.TrimSpace(string(b))
			}
			client := &http.Client{Timeout: 5 * time.Second}
			resp, err := client.Get("http://" + addr + "/status")
			if errors.Is(err, syscall.ECONNREFUSED) {
				if cfg != nil {
					return fmt.Errorf("the node of %s is not running: nothing answers at %s, where it last served (killed or crashed?)%s",
						cfgPath, addr, lastHead(cfg))
				}
				return fmt.Errorf("no node is running at %s (connection refused)", addr)
			}
			if err != nil {
				return fmt.Errorf("read status from %s: %w", addr, err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("status from %s: %s", addr, resp.Status)
			}
			if raw {
				_, err = cmd.OutOrStdout().Write(body)
				return err
			}
			var s status.Status
			if err := json.Unmarshal(body, &s); err != nil {
				return fmt.Errorf("status from %s: %w", addr, err)
			}
			printStatus(cmd.OutOrStdout(), &s)
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "the node's HTTP address")
	cmd.Flags().StringVarP(&cfgPath, "config", "c", "p2pnode.yaml", "experiment config file (to find the address)")
	cmd.Flags().BoolVar(&raw, "json", false, "print the raw JSON")
	return cmd
}

// lastHead describes the newest head in a stopped node's store ("" if there is none).
func lastHead(cfg *config.Config) string {
	if _, err := os.Stat(filepath.Join(cfg.Node.StoreDir, "heads")); err != nil {
		return "" // never ran here; do not create a store by looking
	}
	st, err := node.OpenStores(cfg)
	if err != nil {
		return ""
	}
	id, err := st.ResolveHead("latest")
	if err != nil {
		return ""
	}
	_, h, err := st.Heads.Get(id)
	if err != nil {
		return fmt.Sprintf("; its last head is %s", id)
	}
	return fmt.Sprintf("; its last head is %s (round %d)", id, h.Round)
}

func printStatus(w io.Writer, s *status.Status) {
	fmt.Fprintf(w, "peer        %s\nroles       %s\nexperiment  %s/%s\n", s.Peer, strings.Join(s.Roles, "+"), s.Network, s.Experiment)
	fmt.Fprintf(w, "addresses   %s\nconnected   %d peers\n", strings.Join(s.Addrs, " "), len(s.Connected))
	fmt.Fprintf(w, "head        %s (round %d, epoch %d, train loss %.4f)\n", s.Head, s.Round, s.Epoch, s.TrainLoss)
	for k, v := range s.HeadMetrics {
		fmt.Fprintf(w, "held-out    %s %.4f\n", k, v)
	}
	for _, l := range s.Leases {
		fmt.Fprintf(w, "lease       round %d, %d microshards, expires %s\n", l.Round, len(l.Microshards), l.Expiry.Format(time.TimeOnly))
	}
	if s.CreditSummary != "" {
		fmt.Fprintf(w, "credit      %s\n", s.CreditSummary)
	}
	if c := s.Last; c != nil {
		fmt.Fprintf(w, "contributed round %d: %d samples, loss %.4f, %.1fs\n", c.Round, c.Samples, c.Loss, c.Seconds)
	}
	if o := s.Overlap; o != nil {
		fmt.Fprintf(w, "overlap     %d of %d windows trained ahead", o.Ahead, o.Windows)
		switch {
		case o.Ahead == 0:
		case o.LastMovedAt >= 0:
			fmt.Fprintf(w, "; the last moved onto its head before step %d of %d", o.LastMovedAt+1, o.LastSteps)
		default:
			fmt.Fprint(w, "; the last finished before its head came")
		}
		fmt.Fprintln(w)
	}
	if v := s.Validator; v != nil {
		fmt.Fprintf(w, "leading     round %d attempt %d: %d live trainers, %d/%d reported\n", v.Round, v.Attempt, v.Trainers, len(v.Received), len(v.Leased))
		for _, p := range slices.Sorted(maps.Keys(v.Barred)) {
			fmt.Fprintf(w, "barred      %s this round: %s\n", p, v.Barred[p])
		}
		if len(v.Rejections) > 0 {
			var parts []string
			for _, r := range slices.Sorted(maps.Keys(v.Rejections)) {
				parts = append(parts, fmt.Sprintf("%s %d", r, v.Rejections[r]))
			}
			fmt.Fprintf(w, "rejected    %s\n", strings.Join(parts, ", "))
		}
	}
	if s.Worker != nil {
		b, _ := json.Marshal(s.Worker)
		fmt.Fprintf(w, "worker      %s\n", b)
	}
	for _, e := range s.Events {
		fmt.Fprintf(w, "event       %s %s: %s\n", e.At.Format(time.TimeOnly), e.Kind, e.Text)
	}
}

func newAuditCmd(g *globalFlags) *cobra.Command {
	var cfgPath, head string
	cmd := &cobra.Command{
		Use:   "audit --config FILE [--head CID|latest]",
		Short: "Prove from the head chain that every microshard was trained exactly once per epoch",
		Long: `Walk the head chain from --head back to genesis, replaying the microshard ledger: every
head's ledger must equal its parent's plus the microshards it merged, no microshard may be
merged twice in an epoch, and an epoch ends only when all were consumed. Prints the
report as JSON; exits non-zero on the first violation.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			st, id, err := openHead(cfg, head)
			if err != nil {
				return err
			}
			rep, err := st.Audit(id)
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			if encErr := enc.Encode(rep); encErr != nil {
				return encErr
			}
			return err
		},
	}
	cmd.Flags().StringVarP(&cfgPath, "config", "c", "p2pnode.yaml", "experiment config file")
	cmd.Flags().StringVar(&head, "head", "latest", "head CID to audit, or latest")
	return cmd
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), version.String())
		},
	}
}

// openHead opens the node's stores from cfg and resolves head (a CID or "latest").
func openHead(cfg *config.Config, head string) (*node.Stores, cid.Cid, error) {
	st, err := node.OpenStores(cfg)
	if err != nil {
		return nil, cid.Undef, err
	}
	id, err := st.ResolveHead(head)
	if err != nil {
		return nil, cid.Undef, err
	}
	return st, id, nil
}
