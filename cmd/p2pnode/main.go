// Command p2pnode runs a peer-to-peer training node. See `p2pnode --help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// exitInterrupted is the exit status after Ctrl-C (128 + SIGINT), as shells report an
// interrupted command. SIGTERM — how docker, systemd and supervisors stop a service — is a
// requested stop: after it the node exits 0.
const exitInterrupted = 130

// interrupted is the cause of the root context's cancellation when a signal arrived.
type interrupted struct{ sig os.Signal }

func (i interrupted) Error() string { return "received " + i.sig.String() }

func main() {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go stopOnSignal(sigs, func() { signal.Stop(sigs) }, cancel, os.Stderr)
	os.Exit(runMain(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// stopOnSignal waits for the first signal on sigs, says once on w that the node is
// stopping, calls release (the handler gone, a second Ctrl-C kills the process at once) and
// cancels the run with the signal as the cause.
func stopOnSignal(sigs <-chan os.Signal, release func(), cancel context.CancelCauseFunc, w io.Writer) {
	sig := <-sigs
	release()
	if sig == os.Interrupt {
		fmt.Fprintln(w, "p2pnode: stopping… (Ctrl-C again to quit at once)")
	} else {
		fmt.Fprintf(w, "p2pnode: %s: stopping…\n", sig)
	}
	cancel(interrupted{sig})
}

// runMain executes the command line and returns the exit status: 0, 1 after an error (printed
// as one line), 130 after Ctrl-C and 0 after SIGTERM (quietly: a clean stop is not an error).
func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return stopStatus(context.Cause(ctx))
	}
	if err != nil {
		if !errors.Is(err, errSilent) {
			fmt.Fprintln(root.ErrOrStderr(), "p2pnode:", err)
		}
		return 1
	}
	return 0
}

// stopStatus is the exit status of a run stopped by cause: 0 after SIGTERM, 130 otherwise.
func stopStatus(cause error) int {
	var sig interrupted
	if errors.As(cause, &sig) && sig.sig == syscall.SIGTERM {
		return 0
	}
	return exitInterrupted
}

// errSilent marks errors already reported to the user.
var errSilent = errors.New("failed")
