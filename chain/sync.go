package chain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-msgio"
)

// SyncProtocol lets a node ask a peer for its canonical head and for heads by CID, so late
// joiners and nodes back from a partition can fetch the chain they missed.
const SyncProtocol = "/p2ptrain/head/1.0.0"

const (
	syncTimeout = 15 * time.Second
	// DefaultSyncDeadline bounds how long a peer may take to send its request.
	DefaultSyncDeadline = 10 * time.Second

	syncMaxRequest  = 1 << 10
	syncMaxResponse = MaxHeadBytes + 128<<10
	// SyncServiceName is the resource-manager service that accounts head-sync streams.
	SyncServiceName = "p2ptrain.head-sync"
)

// ErrSync is wrapped by errors a peer answers with or a protocol violation.
var ErrSync = errors.New("head sync")

type syncRequest struct {
	Kind string `cbor:"1,keyasint"` // "tip" or "get"
	ID   []byte `cbor:"2,keyasint,omitempty"`
}

type syncResponse struct {
	Status  uint64 `cbor:"1,keyasint"` // 0 ok, 1 not found, 2 bad request
	Head    []byte `cbor:"2,keyasint,omitempty"`
	Message string `cbor:"3,keyasint,omitempty"`
	// Notes are the head's signed round notes, when the peer holds them.
	Notes []byte `cbor:"4,keyasint,omitempty"`
}

// SyncService answers head requests from the local store.
type SyncService struct {
	h        host.Host
	store    *Store
	tip      func() cid.Cid
	log      *slog.Logger
	deadline time.Duration
}

// NewSyncService registers the head-sync handler; tip returns the canonical head. A peer
// must send its request within deadline (DefaultSyncDeadline when zero) and read the
// answer within the same time again, or the stream is reset.
func NewSyncService(h host.Host, store *Store, tip func() cid.Cid, log *slog.Logger, deadline time.Duration) *SyncService {
	if deadline <= 0 {
		deadline = DefaultSyncDeadline
	}
	s := &SyncService{h: h, store: store, tip: tip, log: log, deadline: deadline}
	h.SetStreamHandler(SyncProtocol, s.handle)
	return s
}

// Close removes the handler.
func (s *SyncService) Close() { s.h.RemoveStreamHandler(SyncProtocol) }

func (s *SyncService) handle(st network.Stream) {
	if err := st.Scope().SetService(SyncServiceName); err != nil {
		st.Reset()
		return
	}
	if err := st.Scope().ReserveMemory(syncMaxResponse, network.ReservationPriorityLow); err != nil {
		st.Reset()
		return
	}
	defer st.Scope().ReleaseMemory(syncMaxResponse)
	// One request per stream, sent as soon as the stream opens: it has the frame
	// deadline to arrive whole, and the answer as long again to be read.
	_ = st.SetDeadline(time.Now().Add(s.deadline))
	r := msgio.NewVarintReaderSize(st, syncMaxRequest)
	b, err := r.ReadMsg()
	if err != nil {
		st.Reset()
		return
	}
	_ = st.SetWriteDeadline(time.Now().Add(s.deadline))
	var req syncRequest
	resp := syncResponse{}
	if err := Unmarshal(b, &req); err != nil {
		resp = syncResponse{Status: 2, Message: "malformed request"}
	} else {
		resp = s.answer(req)
	}
	out, err := Marshal(&resp)
	if err == nil {
		err = msgio.NewVarintWriter(st).WriteMsg(out)
	}
	if err != nil {
		st.Reset()
		return
	}
	st.Close()
}

func (s *SyncService) answer(req syncRequest) syncResponse {
	var id cid.Cid
	switch req.Kind {
	case "tip":
		id = s.tip()
		if !id.Defined() {
			return syncResponse{Status: 1, Message: "no canonical head yet"}
		}
	case "get":
		c, err := cid.Cast(req.ID)
		if err != nil {
			return syncResponse{Status: 2, Message: "bad head id"}
		}
		id = c
	default:
		return syncResponse{Status: 2, Message: fmt.Sprintf("unknown request %q", req.Kind)}
	}
	sh, _, err := s.store.Get(id)
	if err != nil {
		return syncResponse{Status: 1, Message: "head not found"}
	}
	b, err := EncodeSigned(sh)
	if err != nil {
		return syncResponse{Status: 1, Message: "head not available"}
	}
	resp := syncResponse{Head: b}
	if n, err := s.store.Notes(id); err == nil {
		if nb, err := Marshal(n); err == nil {
			resp.Notes = nb
		}
	}
	return resp
}

// Fetched is a head fetched from a peer, with its round notes when the peer had notes
// whose signature verifies (nil otherwise: notes are optional, and who signed them is for
// the caller to judge).
type Fetched struct {
	Signed *SignedHead
	Head   *Head
	Notes  *Notes
}

// RequestTip asks p for its canonical head.
func RequestTip(ctx context.Context, h host.Host, p peer.ID) (*Fetched, error) {
	return request(ctx, h, p, syncRequest{Kind: "tip"}, cid.Undef)
}

// RequestHead asks p for the head with the given id; the answer must hash to it.
func RequestHead(ctx context.Context, h host.Host, p peer.ID, id cid.Cid) (*Fetched, error) {
	return request(ctx, h, p, syncRequest{Kind: "get", ID: id.Bytes()}, id)
}

func request(ctx context.Context, h host.Host, p peer.ID, req syncRequest, want cid.Cid) (*Fetched, error) {
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	// A relayed connection carries these small records too: without leave to use it, a
	// stream to a peer reached only through a relay (a trainer behind NAT, from a
	// validator behind another) waits out the timeout for a direct connection that never
	// comes, and head sync, which asks one peer at a time, stalls that long.
	st, err := h.NewStream(network.WithAllowLimitedConn(ctx, "head sync"), p, SyncProtocol)
	if err != nil {
		return nil, fmt.Errorf("head sync with %s: %w", p, err)
	}
	if d, ok := ctx.Deadline(); ok {
		_ = st.SetDeadline(d)
	}
	fail := func(err error) (*Fetched, error) {
		st.Reset()
		return nil, fmt.Errorf("head sync with %s: %w", p, err)
	}
	b, err := Marshal(&req)
	if err != nil {
		return fail(err)
	}
	if err := msgio.NewVarintWriter(st).WriteMsg(b); err != nil {
		return fail(err)
	}
	_ = st.CloseWrite()
	rb, err := msgio.NewVarintReaderSize(st, syncMaxResponse).ReadMsg()
	if err != nil {
		return fail(err)
	}
	var resp syncResponse
	if err := Unmarshal(rb, &resp); err != nil {
		return fail(fmt.Errorf("%w: malformed response: %v", ErrSync, err))
	}
	if resp.Status != 0 {
		st.Close()
		if resp.Status == 1 {
			return nil, fmt.Errorf("head sync with %s: %w (%s)", p, ErrNotFound, resp.Message)
		}
		return nil, fmt.Errorf("head sync with %s: %w: %s", p, ErrSync, resp.Message)
	}
	sh, hd, err := DecodeSigned(resp.Head)
	if err != nil {
		return fail(err)
	}
	if want.Defined() && !sh.ID().Equals(want) {
		return fail(fmt.Errorf("%w: asked for head %s, got %s", ErrSync, want, sh.ID()))
	}
	st.Close()
	out := &Fetched{Signed: sh, Head: hd}
	if len(resp.Notes) > 0 {
		if n, err := DecodeNotes(resp.Notes); err == nil && n.Round == hd.Round && VerifyNotes(sh.ID(), n) == nil {
			out.Notes = n
		}
	}
	return out, nil
}
