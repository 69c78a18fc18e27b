package invite

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-msgio"
)

// ProtocolID is the record's protocol: the server writes one length-prefixed frame, the
// encoded record, then, when it knows them, a second one, the encoded Sizes, and closes
// the stream; the client sends nothing. A client that reads one frame and closes still
// works with a server that sends two. The protocol is not
// namespaced by the experiment, since the joining node does not know it yet.
const ProtocolID = protocol.ID("/p2pnode/invite/1.0.0")

// ServiceName is the resource manager's service for the protocol's streams.
const ServiceName = "p2pnode.invite"

// DefaultDeadline bounds writing the record to a peer, and fetching it.
const DefaultDeadline = 30 * time.Second

// Server serves one encoded record on a host.
type Server struct {
	h        host.Host
	rec      atomic.Pointer[[]byte]
	sizes    atomic.Pointer[func() (Sizes, bool)]
	log      *slog.Logger
	deadline time.Duration
}

// Serve registers the handler that answers with r; Close removes it.
func Serve(h host.Host, r *Record, log *slog.Logger) (*Server, error) {
	s := &Server{h: h, log: log, deadline: DefaultDeadline}
	if err := s.Set(r); err != nil {
		return nil, err
	}
	h.SetStreamHandler(ProtocolID, s.handle)
	return s, nil
}

// Set replaces the record served.
func (s *Server) Set(r *Record) error {
	b, err := Encode(r)
	if err != nil {
		return fmt.Errorf("serve experiment record: %w", err)
	}
	if len(b) > MaxRecordBytes {
		return fmt.Errorf("serve experiment record: %d bytes exceeds the %d-byte limit", len(b), MaxRecordBytes)
	}
	s.rec.Store(&b)
	return nil
}

// SetSizes sets what the server reports about the downloads with each record: fn is
// called per request and reports false when it knows nothing yet.
func (s *Server) SetSizes(fn func() (Sizes, bool)) { s.sizes.Store(&fn) }

// Close removes the handler.
func (s *Server) Close() { s.h.RemoveStreamHandler(ProtocolID) }

func (s *Server) handle(st network.Stream) {
	if err := st.Scope().SetService(ServiceName); err != nil {
		st.Reset()
		return
	}
	_ = st.SetDeadline(time.Now().Add(s.deadline))
	b := *s.rec.Load()
	if err := msgio.NewVarintWriter(st).WriteMsg(b); err != nil {
		s.log.Debug("send experiment record", "peer", st.Conn().RemotePeer(), "err", err)
		st.Reset()
		return
	}
	if fn := s.sizes.Load(); fn != nil {
		if sz, ok := (*fn)(); ok {
			b, err := EncodeSizes(sz)
			if err == nil {
				err = msgio.NewVarintWriter(st).WriteMsg(b)
			}
			if err != nil {
				s.log.Debug("send sizes", "peer", st.Conn().RemotePeer(), "err", err)
				st.Reset()
				return
			}
		}
	}
	s.log.Debug("sent experiment record", "peer", st.Conn().RemotePeer())
	st.Close()
}

// Fetch asks p for its experiment record and decodes it (Verify checks it), with the sizes
// p reports (nil when it sends none, or bytes that are not sizes: they are only printed).
func Fetch(ctx context.Context, h host.Host, p peer.ID) (*Record, *Sizes, error) {
	ctx, cancel := context.WithTimeout(ctx, DefaultDeadline)
	defer cancel()
	st, err := h.NewStream(ctx, p, ProtocolID)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch experiment record from %s: %w", p, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = st.SetDeadline(dl)
	}
	_ = st.CloseWrite()
	rd := msgio.NewVarintReaderSize(st, MaxRecordBytes)
	b, err := rd.ReadMsg()
	if err != nil {
		st.Reset()
		return nil, nil, fmt.Errorf("fetch experiment record from %s: %w", p, err)
	}
	r, err := Decode(b)
	if err != nil {
		st.Reset()
		return nil, nil, fmt.Errorf("fetch experiment record from %s: %w", p, err)
	}
	var sizes *Sizes
	if sb, err := rd.ReadMsg(); err == nil {
		sizes, _ = DecodeSizes(sb)
	}
	st.Close()
	return r, sizes, nil
}

// FetchFrom dials the peer in info from a short-lived host with key (the joining node's
// own identity, so the owner sees the peer that will train) and fetches its record.
func FetchFrom(ctx context.Context, key crypto.PrivKey, info peer.AddrInfo) (*Record, *Sizes, error) {
	h, err := libp2p.New(libp2p.Identity(key), libp2p.NoListenAddrs, libp2p.DisableRelay(), libp2p.UserAgent("p2pnode-join"))
	if err != nil {
		return nil, nil, fmt.Errorf("fetch experiment record: start a host: %w", err)
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(ctx, DefaultDeadline)
	defer cancel()
	if err := h.Connect(ctx, info); err != nil {
		return nil, nil, fmt.Errorf("fetch experiment record: dial %s: %w", info.ID, err)
	}
	return Fetch(ctx, h, info.ID)
}
