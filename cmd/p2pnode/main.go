// Command p2pnode runs a peer-to-peer training node. See `p2pnode --help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		if !errors.Is(err, errSilent) {
			fmt.Fprintln(os.Stderr, "p2pnode:", err)
		}
		os.Exit(1)
	}
}

// errSilent marks errors already reported to the user.
var errSilent = errors.New("failed")
