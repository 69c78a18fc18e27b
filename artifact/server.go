package artifact

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/network"
)

const (
	// serverPiece is the most chunk data the handler reads from a partial download's
	// file before writing it: chunks up to this size go out in one write (header
	// included), larger ones in pieces, so memory per stream does not grow with the
	// chunk size. Stored artifacts are written straight from their mapping.
	serverPiece   = 1 << 20
	serverReadBuf = 4096
	// serverBaseMemory is reserved for every stream: the request frame and read buffer.
	serverBaseMemory = maxRequestFrame + serverReadBuf
)

// errRefused ends a stream after an error frame was sent: closed, not reset, so the
// fetcher reads why.
var errRefused = errors.New("request refused")

// chunkSource is where the handler reads chunks from: a complete artifact in the store
// or the partial file of a download in progress.
type chunkSource interface {
	layout() *Manifest
	// readChunk fills dst from the artifact at off, which lies within chunk i. It
	// returns errChunkMissing for a chunk the source does not hold.
	readChunk(i int, off int64, dst []byte) error
}

// blobSource serves a stored artifact from its read-only mapping: the chunk goes from
// the page cache straight into the muxer's frame, where a pread would first copy it into
// our buffer (on small VMs that copy costs as much CPU as decrypting the stream).
type blobSource struct {
	m    *Manifest
	blob *Blob
}

func (b *blobSource) layout() *Manifest { return b.m }
func (b *blobSource) readChunk(_ int, off int64, dst []byte) error {
	copy(dst, b.blob.Bytes()[off:])
	return nil
}

func (p *partial) layout() *Manifest { return p.m }

// handleStream serves one fetcher's stream: any number of requests, each answered in
// order.
func (x *Exchange) handleStream(s network.Stream) {
	log := x.log.With("peer", s.Conn().RemotePeer().String())
	if err := s.Scope().SetService(ServiceName); err != nil {
		log.Debug("attach artifact stream to service", "err", err)
		s.Reset()
		return
	}
	if err := s.Scope().ReserveMemory(serverBaseMemory, network.ReservationPriorityAlways); err != nil {
		log.Debug("reserve memory for artifact stream", "err", err)
		s.Reset()
		return
	}
	defer s.Scope().ReleaseMemory(serverBaseMemory)
	if !x.track(s) {
		s.Reset()
		return
	}
	defer x.untrack(s)

	sv := &server{x: x, s: s, log: log, br: bufio.NewReaderSize(s, serverReadBuf)}
	defer sv.release()
	err := sv.serveGuarded()
	switch {
	case err == nil:
		s.Close()
	case errors.Is(err, errRefused):
		log.Debug("artifact request refused", "err", err)
		s.Close()
	default:
		log.Debug("artifact stream failed", "err", err)
		s.Reset()
	}
}

func (x *Exchange) track(s network.Stream) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return false
	}
	x.serving[s] = struct{}{}
	return true
}

func (x *Exchange) untrack(s network.Stream) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.serving, s)
}

type server struct {
	x   *Exchange
	s   network.Stream
	log *slog.Logger
	br  *bufio.Reader

	scratch []int
	out     []byte  // small frames not yet written
	buf     *[]byte // chunk header + piece, reserved in the stream scope
	blob    *blobSource
	blobID  cid.Cid
}

func (sv *server) release() {
	if sv.buf != nil {
		sv.s.Scope().ReleaseMemory(len(*sv.buf))
		buffers.put(sv.buf)
		sv.buf = nil
	}
	if sv.blob != nil {
		sv.blob.blob.Close()
		sv.blob = nil
	}
}

// serveGuarded runs serve, turning a fault while reading a mapped blob (its file
// truncated behind the store's back) into an error for this stream, not a crash.
func (sv *server) serveGuarded() (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if f, ok := r.(interface{ Addr() uintptr }); ok {
				err = fmt.Errorf("fault reading a stored artifact at %#x: %v", f.Addr(), r)
				return
			}
			panic(r)
		}
	}()
	return sv.serve()
}

func (sv *server) serve() error {
	req := buffers.get(maxRequestFrame)
	defer buffers.put(req)
	for {
		// A fetcher may stay quiet between requests for a while, but once a frame has
		// begun it must arrive whole within the frame deadline: a peer that sends part of
		// a request and stalls does not hold the stream for the idle timeout.
		sv.s.SetReadDeadline(time.Now().Add(sv.x.opts.holderIdle))
		if _, err := sv.br.Peek(1); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		sv.s.SetReadDeadline(time.Now().Add(sv.x.opts.FrameDeadline))
		payload, err := readFrame(sv.br, *req, maxRequestFrame)
		if errors.Is(err, errFrameTooLarge) || errors.Is(err, errMalformedFrame) {
			sv.x.m.served.WithLabelValues("invalid", "error").Inc()
			return sv.refuse(codeMalformed, err.Error())
		}
		if err != nil {
			return err
		}
		r, err := decodeRequest(payload, sv.scratch)
		var we *wireError
		if errors.As(err, &we) {
			sv.x.m.served.WithLabelValues("invalid", "error").Inc()
			return sv.refuse(we.code, we.msg)
		}
		sv.scratch = r.indices[:0]
		sv.s.SetWriteDeadline(time.Now().Add(sv.x.opts.RequestTimeout))
		switch r.kind {
		case reqManifest:
			err = sv.serveManifest(r.id)
		case reqChunks:
			err = sv.serveChunks(r)
		}
		if err != nil {
			return err
		}
	}
}

// refuse sends an error frame; the stream is then closed.
func (sv *server) refuse(code int, msg string) error {
	sv.out = appendErrorFrame(sv.out, code, msg)
	if err := sv.flush(); err != nil {
		return err
	}
	return fmt.Errorf("%w: %s", errRefused, msg)
}

func (sv *server) flush() error {
	if len(sv.out) == 0 {
		return nil
	}
	_, err := sv.s.Write(sv.out)
	sv.out = sv.out[:0]
	return err
}

func (sv *server) serveManifest(id cid.Cid) error {
	b, err := sv.x.store.ManifestBytes(id)
	if errors.Is(err, ErrNotFound) {
		err = nil
		if p := sv.x.activePartial(id); p != nil {
			b = p.manifest
		}
	}
	if err != nil {
		sv.log.Warn("read manifest to serve", "artifact", id.String(), "err", err)
		return sv.refuse(codeInternal, "cannot read manifest")
	}
	if b == nil {
		sv.x.m.served.WithLabelValues("manifest", "not_found").Inc()
		sv.out = appendSmallFrame(sv.out, respNotFound, 0, false)
		return sv.flush()
	}
	sv.out = appendUvarint(sv.out, uint64(1+len(b)))
	sv.out = append(sv.out, respManifest)
	sv.out = append(sv.out, b...)
	err = sv.flush()
	if cap(sv.out) > 64<<10 {
		sv.out = nil // do not keep a large manifest's buffer for the stream's life
	}
	sv.x.m.served.WithLabelValues("manifest", "ok").Inc()
	return err
}

// source finds what we hold of id: the stored artifact (kept open across requests) or
// a running download's partial file (looked up again each request, as it may finish).
func (sv *server) source(id cid.Cid) (chunkSource, error) {
	if sv.blob != nil && sv.blobID.Equals(id) {
		return sv.blob, nil
	}
	if sv.x.store.Has(id) {
		src, err := sv.openStored(id)
		// A pruner may remove the artifact between Has and here: that is "not found".
		if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		if src != nil {
			return src, nil
		}
	}
	if p := sv.x.activePartial(id); p != nil {
		return p, nil
	}
	return nil, nil
}

// openStored maps a stored artifact and keeps it as the stream's open blob.
func (sv *server) openStored(id cid.Cid) (*blobSource, error) {
	m, err := sv.x.store.Manifest(id)
	if err != nil {
		return nil, err
	}
	blob, err := sv.x.store.Open(id)
	if err != nil {
		return nil, err
	}
	if sv.blob != nil {
		sv.blob.blob.Close()
	}
	sv.blob, sv.blobID = &blobSource{m: m, blob: blob}, id
	return sv.blob, nil
}

// ensureBuf reserves and gets the write buffer for chunks of chunkSize.
func (sv *server) ensureBuf(chunkSize int) error {
	want := min(chunkSize, serverPiece) + maxChunkHeader
	if sv.buf != nil && len(*sv.buf) == want {
		return nil
	}
	if sv.buf != nil {
		sv.s.Scope().ReleaseMemory(len(*sv.buf))
		buffers.put(sv.buf)
		sv.buf = nil
	}
	if err := sv.s.Scope().ReserveMemory(want, network.ReservationPriorityHigh); err != nil {
		return err
	}
	sv.buf = buffers.get(want)
	return nil
}

func (sv *server) serveChunks(r request) error {
	src, err := sv.source(r.id)
	if err != nil {
		sv.log.Warn("open artifact to serve", "artifact", r.id.String(), "err", err)
		return sv.refuse(codeInternal, "cannot read artifact")
	}
	if src == nil {
		sv.x.m.served.WithLabelValues("chunks", "not_found").Inc()
		sv.out = appendSmallFrame(sv.out, respNotFound, 0, false)
		return sv.flush()
	}
	m := src.layout()
	bufSize := int(m.ChunkSize)
	if _, mapped := src.(*blobSource); mapped {
		bufSize = 0 // only chunk headers go through our buffer
	}
	if err := sv.ensureBuf(bufSize); err != nil {
		sv.log.Debug("reserve memory to serve chunks", "err", err)
		return sv.refuse(codeInternal, "out of resources")
	}
	for _, i := range r.indices {
		if i >= len(m.Chunks) {
			sv.x.m.served.WithLabelValues("chunks", "error").Inc()
			return sv.refuse(codeBadIndex, fmt.Sprintf("chunk %d out of range: artifact %s has %d chunks", i, r.id, len(m.Chunks)))
		}
		err := sv.writeChunk(src, m, i)
		if errors.Is(err, errChunkMissing) {
			sv.out = appendSmallFrame(sv.out, respMissing, uint64(i), true)
			continue
		}
		if err != nil {
			return fmt.Errorf("serve chunk %d of %s: %w", i, r.id, err)
		}
	}
	sv.x.m.served.WithLabelValues("chunks", "ok").Inc()
	return sv.flush()
}

// writeChunk sends chunk i: its header and first piece in one write.
func (sv *server) writeChunk(src chunkSource, m *Manifest, i int) error {
	begin, end := m.ChunkRange(i)
	n := int(end - begin)
	if b, ok := src.(*blobSource); ok {
		return sv.writeMapped(i, b.blob.Bytes()[begin:end])
	}
	buf := *sv.buf
	piece := len(buf) - maxChunkHeader
	first := min(n, piece)
	if err := src.readChunk(i, begin, buf[maxChunkHeader:maxChunkHeader+first]); err != nil {
		return err
	}
	if err := sv.flush(); err != nil {
		return err
	}
	start := putChunkHeader(buf[:maxChunkHeader], i, n)
	sv.s.SetWriteDeadline(time.Now().Add(sv.x.opts.RequestTimeout))
	if _, err := sv.s.Write(buf[start : maxChunkHeader+first]); err != nil {
		return err
	}
	for off := first; off < n; {
		k := min(piece, n-off)
		if err := src.readChunk(i, begin+int64(off), buf[:k]); err != nil {
			// Part of the frame is out: the stream cannot continue.
			return fmt.Errorf("read chunk %d: %v", i, err)
		}
		sv.s.SetWriteDeadline(time.Now().Add(sv.x.opts.RequestTimeout))
		if _, err := sv.s.Write(buf[:k]); err != nil {
			return err
		}
		off += k
	}
	sv.x.m.bytesSent.Add(float64(n))
	return nil
}

// writeMapped sends a chunk held in memory: the header from our buffer, the data
// without a copy of ours.
func (sv *server) writeMapped(i int, data []byte) error {
	hdr := (*sv.buf)[:maxChunkHeader]
	start := putChunkHeader(hdr, i, len(data))
	sv.out = append(sv.out, hdr[start:]...)
	if err := sv.flush(); err != nil {
		return err
	}
	sv.s.SetWriteDeadline(time.Now().Add(sv.x.opts.RequestTimeout))
	if _, err := sv.s.Write(data); err != nil {
		return err
	}
	sv.x.m.bytesSent.Add(float64(len(data)))
	return nil
}
