package artifact

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// errPeerLacks is a holder's "not found" answer.
var errPeerLacks = errors.New("peer does not hold the artifact")

// fetchManifest asks candidates for the manifest, up to MaxPeers at a time, and returns
// the first answer that hashes to the artifact id. Peers that send other bytes are
// penalised.
func (d *download) fetchManifest() ([]byte, *Manifest, error) {
	ctx, cancel := context.WithCancel(d.ctx)
	defer cancel()
	type result struct {
		p   peer.ID
		b   []byte
		m   *Manifest
		err error
	}
	results := make(chan result)
	// Peers asked here stay candidates for chunks unless they fail.
	asked := make(map[peer.ID]bool)
	inflight, knownInflight := 0, 0
	isKnown, isCopy := make(map[peer.ID]bool), make(map[peer.ID]bool)
	for {
		for inflight < d.x.opts.MaxPeers {
			c, ok := d.nextCandidate(asked, knownInflight == 0)
			if !ok {
				break
			}
			inflight++
			if c.known {
				knownInflight++
				isKnown[c.p] = true
			}
			isCopy[c.p] = c.direct
			go func() {
				b, m, err := d.x.requestManifest(ctx, c.p, d.id, c.direct)
				select {
				case results <- result{c.p, b, m, err}:
				case <-ctx.Done():
				}
			}()
		}
		if inflight == 0 {
			errs, notFound := d.peerErrors()
			if len(errs) == 0 {
				return nil, nil, fmt.Errorf("%w (asked %d peers, %d lack it)", ErrNoHolders, len(asked), notFound)
			}
			return nil, nil, fmt.Errorf("get manifest: %w", errors.Join(errs...))
		}
		select {
		case r := <-results:
			inflight--
			if isKnown[r.p] {
				knownInflight--
			}
			if r.err == nil {
				d.log.Debug("manifest received", "peer", r.p.String(), "size", r.m.Size, "chunks", len(r.m.Chunks))
				return r.b, r.m, nil
			}
			outcome := peerOutcome(r.err)
			if outcome == peerBadManifest || outcome == peerProtocol {
				d.penalise(r.p, outcome, r.err)
			}
			if isCopy[r.p] {
				d.x.copyFailed(r.p, r.err)
			}
			d.x.m.peerDrops.WithLabelValues(outcome).Inc()
			d.peerLeft(r.p, r.err)
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// requestManifest fetches and verifies the manifest of id from p on a stream of its own
// (direct: only over a direct connection, see newStream).
func (x *Exchange) requestManifest(ctx context.Context, p peer.ID, id cid.Cid, direct bool) ([]byte, *Manifest, error) {
	s, err := x.openStream(ctx, p, direct)
	if err != nil {
		return nil, nil, err
	}
	// The watchdog (not only stream deadlines) bounds the wait: mocknet streams ignore
	// deadlines, and a caller's context may be long.
	wd := newWatchdog(x.stallTimeout(direct), func() { s.Reset() })
	defer wd.stop()
	stopOnCancel := context.AfterFunc(ctx, func() { s.Reset() })
	defer stopOnCancel()
	wd.arm()

	asked := time.Now()
	if _, err := s.Write(appendRequest(nil, request{kind: reqManifest, id: id})); err != nil {
		s.Reset()
		return nil, nil, fmt.Errorf("%w: send manifest request: %w", errPeerGone, err)
	}
	br := bufio.NewReaderSize(s, 4096)
	resp, err := readResponse(br, MaxManifestBytes+1)
	if err != nil {
		s.Reset()
		return nil, nil, classifyReadErr(err, wd.fired())
	}
	x.recordRTT(p, asked)
	switch resp.kind {
	case respManifest:
		b := make([]byte, resp.dataLen)
		if _, err := io.ReadFull(br, b); err != nil {
			s.Reset()
			return nil, nil, classifyReadErr(noEOF(err), wd.fired())
		}
		s.Close()
		m, err := DecodeManifest(b, id)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %w", errBadManifest, err)
		}
		return b, m, nil
	case respNotFound:
		s.Close()
		return nil, nil, errPeerLacks
	case respError:
		s.Close()
		return nil, nil, &remoteError{code: resp.code, msg: resp.msg}
	default:
		s.Reset()
		return nil, nil, fmt.Errorf("%w: response kind 0x%02x to a manifest request", errProtocol, resp.kind)
	}
}

// openStream opens an artifact stream to p, accounted to our resource-manager service
// (direct: only over a direct connection, see newStream).
func (x *Exchange) openStream(ctx context.Context, p peer.ID, direct bool) (network.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, x.opts.RequestTimeout)
	defer cancel()
	s, err := x.newStream(ctx, p, direct)
	if err != nil {
		return nil, fmt.Errorf("%w: open stream: %w", errPeerGone, err)
	}
	if err := s.Scope().SetService(ServiceName); err != nil {
		s.Reset()
		return nil, fmt.Errorf("%w: attach stream to service: %w", errPeerGone, err)
	}
	return s, nil
}
