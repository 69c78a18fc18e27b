package pyruntime

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ProtocolVersion is the worker protocol version this node speaks.
const ProtocolVersion = 1

// MaxFrameSize bounds one frame's JSON payload (docs/worker-protocol.md).
const MaxFrameSize = 16 << 20

var errFrameTooLarge = errors.New("frame too large")

// writeFrame writes a 4-byte big-endian length and the payload in one write.
func writeFrame(w io.Writer, payload []byte) error {
	if len(payload) > MaxFrameSize {
		return fmt.Errorf("%w: %d bytes exceeds %d", errFrameTooLarge, len(payload), MaxFrameSize)
	}
	buf := make([]byte, 4+len(payload))
	binary.BigEndian.PutUint32(buf, uint32(len(payload)))
	copy(buf[4:], payload)
	_, err := w.Write(buf)
	return err
}

// readFrame reads one frame of at most limit payload bytes. A clean end of input before
// a frame is io.EOF; an end inside a frame is io.ErrUnexpectedEOF.
func readFrame(r io.Reader, limit int) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(limit) {
		return nil, fmt.Errorf("%w: %d bytes exceeds %d", errFrameTooLarge, n, limit)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}
