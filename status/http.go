package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/p2pnode/p2pnode/internal/atomicfile"
)

// HTTPAddrFile is written in the store directory with the bound HTTP address, so that
// `p2pnode status --config` finds a node listening on a random port.
const HTTPAddrFile = "http.addr"

// HTTPServer serves /status (JSON) and /metrics (Prometheus), on 127.0.0.1 by default.
type HTTPServer struct {
	// Fallback is how many ports after the configured one are tried when it is taken,
	// before any free port (0: none; the configured address or an error).
	Fallback int
	// Announce, when set, gets one line with the dashboard's URL once it listens.
	Announce io.Writer

	srv      *http.Server
	addrFile string
	ln       net.Listener
	log      *slog.Logger
	addr     string
}

func NewHTTPServer(addr, addrFile string, board *Board, reg *prometheus.Registry, log *slog.Logger) *HTTPServer {
	mux := http.NewServeMux()
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(board.Snapshot())
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(dashboardHTML)
	})
	return &HTTPServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, log: log, addr: addr, addrFile: addrFile}
}

func (h *HTTPServer) Start(context.Context) error {
	ln, err := net.Listen("tcp", h.addr)
	if errors.Is(err, syscall.EADDRINUSE) && h.Fallback > 0 {
		ln, err = h.listenFallback()
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("node.http: %s is already in use (another p2pnode with this config?); set another port, or port 0 for a free one", h.addr)
	}
	if err != nil {
		return fmt.Errorf("node.http: listen on %s: %w", h.addr, err)
	}
	h.ln = ln
	h.log.Info("status on http://" + ln.Addr().String() + "/status")
	if h.Announce != nil {
		fmt.Fprintf(h.Announce, "dashboard   http://%s/\n", ln.Addr())
	}
	if h.addrFile != "" {
		if err := atomicfile.Write(h.addrFile, []byte(ln.Addr().String()+"\n"), 0o644); err != nil {
			h.log.Warn("could not record the HTTP address", "err", err)
		}
	}
	go func() {
		if err := h.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.log.Error("http server", "err", err)
		}
	}()
	return nil
}

// listenFallback listens on the first free one of the Fallback ports after the configured
// one, or else on any free port of the same host.
func (h *HTTPServer) listenFallback() (net.Listener, error) {
	host, port, err := net.SplitHostPort(h.addr)
	if err != nil {
		return nil, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, err
	}
	for next := p + 1; next <= p+h.Fallback && next < 65536; next++ {
		if ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(next))); err == nil {
			h.log.Info("node.http: port taken, using the next free one", "configured", h.addr, "port", next)
			return ln, nil
		}
	}
	h.log.Info("node.http: ports taken, using any free one", "configured", h.addr, "tried", h.Fallback+1)
	return net.Listen("tcp", net.JoinHostPort(host, "0"))
}

// Stop shuts the server down and removes the address file, so that `p2pnode status` can
// tell a stopped node from one that died.
func (h *HTTPServer) Stop(ctx context.Context) error {
	if h.addrFile != "" && h.ln != nil {
		_ = os.Remove(h.addrFile)
	}
	return h.srv.Shutdown(ctx)
}

// Addr is the bound address (after Start).
func (h *HTTPServer) Addr() string {
	if h.ln == nil {
		return ""
	}
	return h.ln.Addr().String()
}
