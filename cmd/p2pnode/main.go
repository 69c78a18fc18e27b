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

// exitInterrupted is the exit status after Ctrl-C or SIGTERM (128 + SIGINT), as shells
// report an interrupted command.
const exitInterrupted = 130

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // the first signal stops the node cleanly; a second one kills it at once
	}()
	os.Exit(runMain(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// runMain executes the command line and returns the exit status: 0, 1 after an error (printed
// as one line), or 130 when interrupted (quietly: a clean stop is not an error).
func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return exitInterrupted
	}
	if err != nil {
		if !errors.Is(err, errSilent) {
			fmt.Fprintln(root.ErrOrStderr(), "p2pnode:", err)
		}
		return 1
	}
	return 0
}

// errSilent marks errors already reported to the user.
var errSilent = errors.New("failed")
