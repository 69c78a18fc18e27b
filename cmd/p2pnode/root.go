package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/p2pnode/p2pnode/internal/progress"
	"github.com/p2pnode/p2pnode/internal/version"
)

type globalFlags struct {
	logFormat string
	logLevel  string
}

func newRoot() *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:   "p2pnode",
		Short: "Peer-to-peer DiLoCo training node",
		Long: `p2pnode trains one shared model across volunteer machines. Nodes find each other over
libp2p, receive leases on microshards of a dataset, train locally through a Python
(PyTorch) worker, exchange pseudo-gradients as content-addressed artifacts, and advance
the model with DiLoCo outer steps or EMA merges, signed by the experiment's validators.

An experiment is one YAML file: start with 'p2pnode init', run with 'p2pnode run'.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.Version,
	}
	root.SetVersionTemplate(version.String() + "\n")
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", "auto", "log format: auto (text on a terminal, else JSON), text or json")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "", "log level: debug, info, warn, error (default: the config's node.log_level; a terminal then shows\nwarnings and errors beside the command's own progress lines, and INFO records only when this flag asks)")
	root.AddCommand(newRunCmd(g), newJoinCmd(g), newInviteCmd(), newDoctorCmd(), newDemoCmd(g), newInitCmd(), newDatasetCmd(g), newStatusCmd(), newAuditCmd(g), newCreditsCmd(), newExportCmd(g), newVerifyCmd(g), newVersionCmd(), newPythonPackageCmd(), newFleetConfigCmd())
	return root
}

// newLogger builds the root slog logger: text for terminals, JSON otherwise or on request.
func newLogger(g *globalFlags, configLevel string, w io.Writer) (*slog.Logger, error) {
	return newLoggerTo(g, configLevel, w, isTerminal(w))
}

// newLoggerTo is newLogger writing to w, which is a terminal when tty says so (w may wrap
// one).
func newLoggerTo(g *globalFlags, configLevel string, w io.Writer, tty bool) (*slog.Logger, error) {
	level := g.logLevel
	if level == "" {
		level = configLevel
	}
	if level == "" {
		level = "info"
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("--log-level: %q is not debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	format, terminal := g.logFormat, false
	if format == "auto" {
		format = "json"
		if tty {
			format, terminal = "text", true
		}
	}
	switch format {
	case "text":
		if terminal {
			return slog.New(roundDetail{Handler: slog.NewTextHandler(w, opts), quiet: g.logLevel == ""}), nil
		}
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is not auto, text or json", g.logFormat)
}

// roundDetail demotes per-round detail to debug: INFO records with a round attribute
// (leases issued, a window trained, a head proposed). A terminal shows the progress line of
// each round instead; JSON logs, for machines, keep every record at its level. quiet (a
// terminal without --log-level) demotes every INFO record: the start-up's dozen (listening,
// the worker and the dataset ready, the status address) say what the command's own lines
// say (join's summary, the dashboard's address, the dataset's progress), and a volunteer's
// terminal shows those, the round lines, warnings and errors.
type roundDetail struct {
	slog.Handler
	quiet bool
}

func (h roundDetail) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo && (h.quiet || hasRound(r)) {
		if !h.Handler.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
		r.Level = slog.LevelDebug
	}
	return h.Handler.Handle(ctx, r)
}

func (h roundDetail) WithAttrs(as []slog.Attr) slog.Handler {
	return roundDetail{h.Handler.WithAttrs(as), h.quiet}
}
func (h roundDetail) WithGroup(name string) slog.Handler {
	return roundDetail{h.Handler.WithGroup(name), h.quiet}
}

func hasRound(r slog.Record) bool {
	found := false
	r.Attrs(func(a slog.Attr) bool {
		found = a.Key == "round"
		return !found
	})
	return found
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// outputs are a command's standard output and logger, and what shows its long work's
// progress: the terminal's status line when stdout is a terminal and the logs are text
// (output and logs then go through it, around the status line), else periodic log
// records.
type outputs struct {
	out  io.Writer
	log  *slog.Logger
	work progress.Tracker
}

func newOutputs(g *globalFlags, configLevel string, stdout, stderr io.Writer) (*outputs, error) {
	errTTY := isTerminal(stderr)
	textLogs := g.logFormat == "text" || (g.logFormat == "auto" && errTTY)
	if isTerminal(stdout) && textLogs {
		term := progress.NewTerminal(stdout)
		errw := stderr
		if errTTY {
			errw = term.Wrap(stderr)
		}
		log, err := newLoggerTo(g, configLevel, errw, errTTY)
		if err != nil {
			return nil, err
		}
		return &outputs{out: term.Wrap(stdout), log: log, work: term}, nil
	}
	log, err := newLogger(g, configLevel, stderr)
	if err != nil {
		return nil, err
	}
	return &outputs{out: stdout, log: log, work: progress.NewLog(log)}, nil
}
