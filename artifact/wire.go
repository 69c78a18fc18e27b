package artifact

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-varint"

	"github.com/p2pnode/p2pnode/cids"
)

// The /p2ptrain/artifact/1.0.0 wire format (docs/formats.md, "Artifact exchange").
//
// Every message is a frame: an unsigned varint length, then that many payload bytes.
// The fetcher writes request frames; the holder answers each request, in order, with
// response frames. A stream carries any number of requests, so a fetcher can keep
// several in flight and the holder never waits for the next one.

// ProtocolID names the artifact exchange protocol.
const ProtocolID = "/p2ptrain/artifact/1.0.0"

// ServiceName is the resource-manager service that accounts our streams.
const ServiceName = "p2ptrain.artifact"

// wireVersion is the first byte of every request; the protocol id carries the major
// version, this byte lets a later minor version extend requests without a new id.
const wireVersion = 1

// Request kinds.
const (
	reqManifest byte = 0x01 // the manifest of an artifact
	reqChunks   byte = 0x02 // a list of chunks of an artifact
)

// Response kinds: distinct from request kinds, so a confused peer is caught at once.
const (
	respManifest byte = 0x81 // manifest bytes
	respChunk    byte = 0x82 // uvarint index, then the chunk's bytes
	respNotFound byte = 0x83 // the holder has nothing of the artifact; answers a whole request
	respMissing  byte = 0x84 // uvarint index: a partial holder lacks this chunk
	respError    byte = 0x85 // uvarint code, then a UTF-8 message; the holder closes the stream
)

// Error codes carried by respError.
const (
	codeMalformed   = 1 // request frame does not parse
	codeVersion     = 2 // unsupported request version
	codeUnknownKind = 3 // unknown request kind
	codeBadIndex    = 4 // chunk index out of range for the artifact
	codeInternal    = 5 // the holder failed (disk, resource limits)
)

// Limits on what either side reads.
const (
	// MaxChunksPerRequest bounds the indices in one request frame.
	MaxChunksPerRequest = 4096
	maxCIDBytes         = 128
	// maxRequestFrame fits the largest valid request: version, kind, CID and
	// MaxChunksPerRequest indices of at most 5 bytes each.
	maxRequestFrame = 2 + 2 + maxCIDBytes + 3 + MaxChunksPerRequest*5
	maxErrorMessage = 1024
	// maxChunkHeader is a chunk frame's overhead: frame length, kind and index.
	maxChunkHeader = varint.MaxLenUvarint63 + 1 + 5
	// maxIndex keeps indices within what both 32- and 64-bit peers can address.
	maxIndex = 1<<31 - 1
)

var (
	// errFrameTooLarge is returned when a peer announces a frame above the reader's limit.
	errFrameTooLarge = errors.New("frame exceeds size limit")
	// errMalformedFrame is returned for a frame that does not parse.
	errMalformedFrame = errors.New("malformed frame")
)

// wireError is a protocol violation with the code we answer it with.
type wireError struct {
	code int
	msg  string
}

func (e *wireError) Error() string { return e.msg }

func malformed(format string, args ...any) error {
	return &wireError{code: codeMalformed, msg: fmt.Sprintf(format, args...)}
}

// request is a decoded request frame.
type request struct {
	kind    byte
	id      cid.Cid
	indices []int // reqChunks only
}

// appendRequest appends r's frame (length prefix included) to dst.
func appendRequest(dst []byte, r request) []byte {
	idb := r.id.Bytes()
	n := 2 + varint.UvarintSize(uint64(len(idb))) + len(idb)
	if r.kind == reqChunks {
		n += varint.UvarintSize(uint64(len(r.indices)))
		for _, i := range r.indices {
			n += varint.UvarintSize(uint64(i))
		}
	}
	dst = appendUvarint(dst, uint64(n))
	dst = append(dst, wireVersion, r.kind)
	dst = appendUvarint(dst, uint64(len(idb)))
	dst = append(dst, idb...)
	if r.kind == reqChunks {
		dst = appendUvarint(dst, uint64(len(r.indices)))
		for _, i := range r.indices {
			dst = appendUvarint(dst, uint64(i))
		}
	}
	return dst
}

// decodeRequest parses a request payload (without its length prefix). indices reuses
// scratch when it is large enough. Errors are *wireError values naming what is wrong.
func decodeRequest(b []byte, scratch []int) (request, error) {
	var r request
	if len(b) < 2 {
		return r, malformed("request of %d bytes is too short", len(b))
	}
	if b[0] != wireVersion {
		return r, &wireError{code: codeVersion, msg: fmt.Sprintf("request version %d unsupported (want %d)", b[0], wireVersion)}
	}
	r.kind = b[1]
	if r.kind != reqManifest && r.kind != reqChunks {
		return r, &wireError{code: codeUnknownKind, msg: fmt.Sprintf("unknown request kind 0x%02x", r.kind)}
	}
	b = b[2:]
	idLen, n, err := varint.FromUvarint(b)
	if err != nil {
		return r, malformed("request artifact id length: %v", err)
	}
	b = b[n:]
	if idLen == 0 || idLen > maxCIDBytes || idLen > uint64(len(b)) {
		return r, malformed("request artifact id length %d invalid", idLen)
	}
	id, err := cid.Cast(b[:idLen])
	if err != nil {
		return r, malformed("request artifact id: %v", err)
	}
	if err := cids.Check(id, cids.CodecCBOR); err != nil {
		return r, malformed("request artifact id: %v", err)
	}
	r.id = id
	b = b[idLen:]
	if r.kind == reqManifest {
		if len(b) != 0 {
			return r, malformed("manifest request has %d trailing bytes", len(b))
		}
		return r, nil
	}
	count, n, err := varint.FromUvarint(b)
	if err != nil {
		return r, malformed("chunk request count: %v", err)
	}
	b = b[n:]
	// Every index takes at least one byte, so a count larger than what is left is a lie.
	if count == 0 || count > MaxChunksPerRequest || count > uint64(len(b)) {
		return r, malformed("chunk request count %d invalid", count)
	}
	r.indices = scratch[:0]
	for range count {
		i, n, err := varint.FromUvarint(b)
		if err != nil {
			return r, malformed("chunk request index: %v", err)
		}
		if i > maxIndex {
			return r, malformed("chunk index %d out of range", i)
		}
		r.indices = append(r.indices, int(i))
		b = b[n:]
	}
	if len(b) != 0 {
		return r, malformed("chunk request has %d trailing bytes", len(b))
	}
	return r, nil
}

func appendUvarint(dst []byte, x uint64) []byte {
	var tmp [varint.MaxLenUvarint63]byte
	n := varint.PutUvarint(tmp[:], x)
	return append(dst, tmp[:n]...)
}

// readFrameLen reads a frame's length prefix and checks it against limit.
func readFrameLen(r io.ByteReader, limit int) (int, error) {
	n, err := varint.ReadUvarint(r)
	if err != nil {
		return 0, varintErr(err)
	}
	if n > uint64(limit) {
		return 0, fmt.Errorf("%w: %d bytes, limit %d", errFrameTooLarge, n, limit)
	}
	return int(n), nil
}

// readFrame reads one whole frame into buf (which must hold limit bytes).
func readFrame(r *bufio.Reader, buf []byte, limit int) ([]byte, error) {
	n, err := readFrameLen(r, limit)
	if err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		return nil, noEOF(err)
	}
	return buf[:n], nil
}

// varintErr marks an invalid varint as a malformed frame; I/O errors pass through.
func varintErr(err error) error {
	if errors.Is(err, varint.ErrOverflow) || errors.Is(err, varint.ErrNotMinimal) {
		return fmt.Errorf("%w: %w", errMalformedFrame, err)
	}
	return err
}

// noEOF turns a clean EOF inside a frame into ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// putChunkHeader writes the frame header of a chunk frame carrying n data bytes into the
// end of hdr (len(hdr) >= maxChunkHeader) and returns where it starts, so the header can
// sit directly before the data in one buffer and go out in one write.
func putChunkHeader(hdr []byte, index, n int) int {
	var tmp [maxChunkHeader]byte
	k := 1 + varint.PutUvarint(tmp[1:], uint64(index))
	tmp[0] = respChunk
	var lp [varint.MaxLenUvarint63]byte
	l := varint.PutUvarint(lp[:], uint64(k+n))
	start := len(hdr) - k - l
	copy(hdr[start:], lp[:l])
	copy(hdr[start+l:], tmp[:k])
	return start
}

// appendErrorFrame appends a respError frame. The message is cut to maxErrorMessage
// bytes on a rune boundary.
func appendErrorFrame(dst []byte, code int, msg string) []byte {
	if len(msg) > maxErrorMessage {
		msg = msg[:maxErrorMessage]
		for !utf8.ValidString(msg) {
			msg = msg[:len(msg)-1]
		}
	}
	dst = appendUvarint(dst, uint64(1+varint.UvarintSize(uint64(code))+len(msg)))
	dst = append(dst, respError)
	dst = appendUvarint(dst, uint64(code))
	return append(dst, msg...)
}

// appendSmallFrame appends a frame of kind with an optional uvarint argument.
func appendSmallFrame(dst []byte, kind byte, arg uint64, hasArg bool) []byte {
	n := 1
	if hasArg {
		n += varint.UvarintSize(arg)
	}
	dst = appendUvarint(dst, uint64(n))
	dst = append(dst, kind)
	if hasArg {
		dst = appendUvarint(dst, arg)
	}
	return dst
}

// response is the decoded header of a response frame. For respChunk and respManifest
// the data (dataLen bytes) is still unread on the stream.
type response struct {
	kind    byte
	index   int    // respChunk, respMissing
	code    int    // respError
	msg     string // respError
	dataLen int    // respChunk, respManifest
}

// readResponse reads a response frame header from r. Data of manifest and chunk frames
// is left on the stream for the caller to read into its own buffer; every other frame is
// consumed whole. limit bounds the frame length.
func readResponse(r *bufio.Reader, limit int) (response, error) {
	var resp response
	n, err := readFrameLen(r, limit)
	if err != nil {
		return resp, err
	}
	if n == 0 {
		return resp, fmt.Errorf("%w: empty frame", errMalformedFrame)
	}
	kind, err := r.ReadByte()
	if err != nil {
		return resp, noEOF(err)
	}
	resp.kind = kind
	rest := n - 1
	switch kind {
	case respManifest:
		resp.dataLen = rest
	case respChunk, respMissing:
		cr := &countingByteReader{r: r}
		i, err := varint.ReadUvarint(cr)
		if err != nil {
			return resp, varintErr(noEOF(err))
		}
		if cr.n > rest || i > maxIndex {
			return resp, fmt.Errorf("%w: chunk index", errMalformedFrame)
		}
		resp.index = int(i)
		resp.dataLen = rest - cr.n
		if kind == respMissing && resp.dataLen != 0 {
			return resp, fmt.Errorf("%w: missing-chunk frame has %d trailing bytes", errMalformedFrame, resp.dataLen)
		}
	case respNotFound:
		if rest != 0 {
			return resp, fmt.Errorf("%w: not-found frame has %d trailing bytes", errMalformedFrame, rest)
		}
	case respError:
		if rest > maxErrorMessage+varint.MaxLenUvarint63 {
			return resp, fmt.Errorf("%w: error frame of %d bytes", errFrameTooLarge, rest)
		}
		b := make([]byte, rest)
		if _, err := io.ReadFull(r, b); err != nil {
			return resp, noEOF(err)
		}
		code, k, err := varint.FromUvarint(b)
		if err != nil {
			return resp, fmt.Errorf("%w: error frame code: %v", errMalformedFrame, err)
		}
		resp.code = int(min(code, 1<<16))
		resp.msg = string(b[k:])
		if !utf8.ValidString(resp.msg) {
			resp.msg = fmt.Sprintf("%q", resp.msg)
		}
	default:
		return resp, fmt.Errorf("%w: unknown kind 0x%02x", errMalformedFrame, kind)
	}
	return resp, nil
}

type countingByteReader struct {
	r io.ByteReader
	n int
}

func (c *countingByteReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.n++
	}
	return b, err
}

// remoteError is an error frame a holder sent us.
type remoteError struct {
	code int
	msg  string
}

func (e *remoteError) Error() string {
	return fmt.Sprintf("holder answered error %d: %s", e.code, e.msg)
}
