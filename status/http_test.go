package status

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// A taken port is an error naming node.http, unless the server may fall back: then it
// takes another free port, and says where the dashboard is.
func TestHTTPServerFallsBackWhenItsPortIsTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	addr := taken.Addr().String()
	log := slog.New(slog.DiscardHandler)

	strict := NewHTTPServer(addr, "", &Board{}, prometheus.NewRegistry(), log)
	err = strict.Start(context.Background())
	require.ErrorContains(t, err, "node.http: "+addr+" is already in use")

	var out bytes.Buffer
	h := NewHTTPServer(addr, "", &Board{}, prometheus.NewRegistry(), log)
	h.Fallback, h.Announce = 3, &out
	require.NoError(t, h.Start(context.Background()))
	defer h.Stop(context.Background())
	require.NotEqual(t, addr, h.Addr())
	require.True(t, strings.HasPrefix(h.Addr(), "127.0.0.1:"), h.Addr())
	require.Equal(t, "dashboard   http://"+h.Addr()+"/\n", out.String())
}
