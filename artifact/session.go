package artifact

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"
)

// lackRetry is how long a session waits before asking a partial holder again for
// chunks it said it lacked.
const lackRetry = time.Second

// defaultIdleReopen: a stream that sat idle this long is closed and a fresh one opened
// before the next request, so we never write into a stream the holder may have dropped
// for idleness (holders wait at least a minute).
const defaultIdleReopen = 30 * time.Second

// hashPiece is how much of a chunk is read from the stream before it is hashed: small
// enough that the hash reads it from the cache the copy just filled.
const hashPiece = 128 << 10

// errIdleStream ends a stream that was idle too long; the session opens another.
var errIdleStream = errors.New("stream idle")

// session fetches chunks from the holder, keeping up to window chunks requested, until
// the download completes, the holder fails, or the context ends. The first session of a
// holder times its first request's answer (recordRTT).
func (pr *peerRun) session(window int, timed bool) error {
	for {
		if err := pr.stream(window, timed); err != errIdleStream {
			return err
		}
		timed = false
	}
}

// stream runs the session over one stream. Chunks it had requested but not received go
// back to the queue for other holders. With timed set, the time from its first request
// to the first answer is recorded as a round trip to the holder.
func (pr *peerRun) stream(window int, timed bool) (err error) {
	d := pr.d
	s, err := d.x.openStream(pr.ctx, pr.p, pr.direct)
	if err != nil {
		return err
	}
	if s.Conn().Stat().Limited {
		pr.relayed.Store(true)
	}
	wd := newWatchdog(d.x.stallTimeout(pr.direct), func() { s.Reset() })
	defer wd.stop()
	stopOnCancel := context.AfterFunc(pr.ctx, func() { s.Reset() })
	defer stopOnCancel()

	var inflight []int // requested and not yet answered, in request order
	defer func() {
		d.q.giveBack(inflight...)
		if err != nil && err != errIdleStream {
			s.Reset()
			if pr.ctx.Err() != nil {
				err = pr.ctx.Err()
			}
		}
	}()

	// Requests go out from their own goroutine, so this one keeps reading while a
	// write waits: on a transport that does not buffer (mocknet pipes), a holder busy
	// writing chunks reads no request until we read those chunks. At most one request
	// per in-flight chunk can be queued, so the channel never fills.
	reqs := make(chan []byte, window+1)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for b := range reqs {
			if _, err := s.Write(b); err != nil {
				s.Reset() // the read below fails and names the cause
				for range reqs {
				}
				return
			}
		}
	}()
	defer func() {
		if err != nil && err != errIdleStream {
			s.Reset() // unblocks a pending write
		}
		close(reqs)
		<-writerDone
	}()

	br := bufio.NewReaderSize(s, 32<<10)
	hs := newChunkHasher()
	take := make([]int, 0, window)
	var idleSince time.Time  // when the stream last ran out of work; zero while busy
	var firstAsked time.Time // when the timed first request went out
	maxFrame := int(d.m.ChunkSize) + maxChunkHeader
	for {
		if len(inflight) <= window/2 {
			var wait <-chan struct{}
			var skip func(int) bool
			if pr.hasLacks() {
				skip = pr.lacksChunk
			}
			take, wait = d.q.take(take, window-len(inflight), skip)
			switch {
			case len(take) > 0 && !idleSince.IsZero() && time.Since(idleSince) > d.x.opts.idleReopen:
				d.q.giveBack(take...)
				s.Close()
				return errIdleStream
			case len(take) > 0:
				idleSince = time.Time{}
				if len(inflight) == 0 {
					wd.arm() // from idle: the countdown starts with the request
				}
				inflight = append(inflight, take...)
				if timed && firstAsked.IsZero() {
					firstAsked = time.Now()
				}
				reqs <- appendRequest(nil, request{kind: reqChunks, id: d.id, indices: take})
			case len(inflight) == 0:
				wd.stop()
				select {
				case <-d.q.complete:
					s.Close() // the holder sees EOF and closes its side
					return nil
				default:
				}
				var retry <-chan time.Time
				if pr.hasLacks() {
					retry = time.After(lackRetry)
				}
				if idleSince.IsZero() {
					idleSince = time.Now()
				}
				select {
				case <-wait:
				case <-retry:
					pr.forgetLacks()
				case <-pr.ctx.Done():
					return pr.ctx.Err()
				}
				continue
			}
		}

		resp, err := readResponse(br, maxFrame)
		if err != nil {
			return classifyReadErr(err, wd.fired())
		}
		wd.arm()
		if timed {
			d.x.recordRTT(pr.p, firstAsked)
			timed = false
		}
		switch resp.kind {
		case respChunk:
			if len(inflight) == 0 || resp.index != inflight[0] {
				return fmt.Errorf("%w: unsolicited chunk %d", errProtocol, resp.index)
			}
			begin, end := d.m.ChunkRange(resp.index)
			if resp.dataLen != int(end-begin) {
				d.x.m.badChunks.Inc()
				return fmt.Errorf("%w: chunk %d is %d bytes, manifest says %d", errBadChunk, resp.index, resp.dataLen, end-begin)
			}
			buf := buffers.get(int(d.m.ChunkSize))
			data := (*buf)[:resp.dataLen]
			hs.reset()
			for off := 0; off < len(data); {
				k := min(hashPiece, len(data)-off)
				if _, err := io.ReadFull(br, data[off:off+k]); err != nil {
					buffers.put(buf)
					return classifyReadErr(noEOF(err), wd.fired())
				}
				hs.write(data[off : off+k])
				off += k
			}
			d.x.m.bytesReceived.Add(float64(resp.dataLen))
			if got := hs.sum(); got != d.pt.digests[resp.index] {
				buffers.put(buf)
				d.x.m.badChunks.Inc()
				return fmt.Errorf("%w: chunk %d hashes to blake3 %s…, manifest says %s: %w",
					errBadChunk, resp.index, hex.EncodeToString(got[:8]), d.m.Chunks[resp.index], ErrCorrupt)
			}
			inflight = inflight[1:]
			pr.chunks.Add(1)
			job := writeJob{index: resp.index, buf: buf, n: resp.dataLen}
			select {
			case d.writeCh <- job:
			default:
				// Our disk is behind; that is no reason to call the holder stalled.
				wd.stop()
				select {
				case d.writeCh <- job:
				case <-pr.ctx.Done():
					buffers.put(buf)
					d.q.giveBack(resp.index)
					return pr.ctx.Err()
				}
				wd.arm()
			}
		case respMissing:
			if len(inflight) == 0 || resp.index != inflight[0] {
				return fmt.Errorf("%w: unsolicited missing-chunk answer %d", errProtocol, resp.index)
			}
			inflight = inflight[1:]
			pr.markLacks(resp.index)
			d.q.giveBack(resp.index)
		case respNotFound:
			return errPeerLacks
		case respError:
			return &remoteError{code: resp.code, msg: resp.msg}
		default:
			return fmt.Errorf("%w: response kind 0x%02x to a chunk request", errProtocol, resp.kind)
		}
	}
}
