package pack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// Reader reads a safetensors file in ranges with positioned reads instead of mapping it:
// a streaming merge reads many files block by block, and pages it has read through a
// mapping would stay in its resident set until the mapping is closed. Only the header is
// held in memory.
type Reader struct {
	Header *Header
	f      *os.File
	size   int64
	path   string
}

// OpenReader opens a safetensors file and parses its header.
func OpenReader(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open safetensors %s: %w", path, err)
	}
	r, err := newReader(f, path)
	if err != nil {
		f.Close()
		return nil, err
	}
	return r, nil
}

func newReader(f *os.File, path string) (*Reader, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat safetensors %s: %w", path, err)
	}
	var prefix [8]byte
	if _, err := f.ReadAt(prefix[:], 0); err != nil {
		return nil, fmt.Errorf("safetensors %s: %w: file is %d bytes", path, ErrMalformed, st.Size())
	}
	n, err := ReadHeaderLen(prefix[:], st.Size())
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	buf := make([]byte, 8+n)
	if _, err := f.ReadAt(buf, 0); err != nil {
		return nil, fmt.Errorf("read safetensors header %s: %w", path, err)
	}
	h, err := ParseHeader(buf, st.Size())
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	return &Reader{Header: h, f: f, size: st.Size(), path: path}, nil
}

// Path is the file's path.
func (r *Reader) Path() string { return r.path }

// DataLen is the number of bytes after the header.
func (r *Reader) DataLen() int64 { return r.size - r.Header.DataStart }

// ReadTensor fills dst with the bytes of tensor t from byte offset off within the tensor.
// A file that shrank since it was opened gives an error naming it, never short data.
func (r *Reader) ReadTensor(t TensorInfo, off int64, dst []byte) error {
	if off < 0 || off+int64(len(dst)) > t.End-t.Begin {
		return fmt.Errorf("read %s tensor %q: %w: bytes [%d, %d) of %d", r.path, t.Name, ErrMalformed, off, off+int64(len(dst)), t.End-t.Begin)
	}
	if _, err := r.f.ReadAt(dst, r.Header.DataStart+t.Begin+off); err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: file is truncated", ErrMalformed)
		}
		return fmt.Errorf("read %s tensor %q: %w", r.path, t.Name, err)
	}
	return nil
}

// Close closes the file.
func (r *Reader) Close() error {
	if r == nil || r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}

// PackReader reads a pack's values in ranges (see Reader).
type PackReader struct {
	*Reader
	Layout Layout
	buf    []byte
}

// OpenPackReader opens a pack file for range reads, checking that it is a pack.
func OpenPackReader(path string) (*PackReader, error) {
	r, err := OpenReader(path)
	if err != nil {
		return nil, err
	}
	layout, err := LayoutOf(r.Header, r.DataLen())
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("pack %s: %w", path, err)
	}
	return &PackReader{Reader: r, Layout: layout}, nil
}

// ReadValues fills dst with values [lo, lo+len(dst)) of the pack (all tensors concatenated
// in layout order).
func (p *PackReader) ReadValues(lo int64, dst []float32) error {
	n := 4 * len(dst)
	if lo < 0 || 4*lo+int64(n) > p.DataLen() {
		return fmt.Errorf("read pack %s: %w: values [%d, %d) of %d", p.path, ErrMalformed, lo, lo+int64(len(dst)), p.DataLen()/4)
	}
	if cap(p.buf) < n {
		p.buf = make([]byte, n)
	}
	b := p.buf[:n]
	if _, err := p.f.ReadAt(b, p.Header.DataStart+4*lo); err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: file is truncated", ErrMalformed)
		}
		return fmt.Errorf("read pack %s: %w", p.path, err)
	}
	for i := range dst {
		dst[i] = float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return nil
}

// StreamWriter writes a pack whose values arrive in order, a block at a time: the header
// (which depends only on the layout and metadata) first, then the values. The bytes are
// those Pack.WriteTo writes for the same layout, values and metadata.
type StreamWriter struct {
	w       io.Writer
	layout  Layout
	left    int64
	scratch []byte
}

// NewStreamWriter writes the header of a canonical pack of layout with meta (plus format
// and layout hash, as Pack.WriteTo adds them) to w.
func NewStreamWriter(w io.Writer, layout Layout, meta map[string]string) (*StreamWriter, error) {
	if !layout.Canonical() {
		return nil, fmt.Errorf("stream pack: tensor names must be unique and ascending")
	}
	infos := make([]TensorInfo, len(layout))
	var off int64
	for i, e := range layout {
		n := 4 * e.Elements()
		infos[i] = TensorInfo{Name: e.Name, DType: F32, Shape: e.Shape, Begin: off, End: off + n}
		off += n
	}
	hdr, err := EncodeHeader(infos, layout.Metadata(meta))
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(hdr); err != nil {
		return nil, fmt.Errorf("write pack header: %w", err)
	}
	return &StreamWriter{w: w, layout: layout, left: layout.Params()}, nil
}

// Write appends values.
func (s *StreamWriter) Write(values []float32) error {
	if int64(len(values)) > s.left {
		return fmt.Errorf("stream pack: %d values past the layout's %d", int64(len(values))-s.left, s.layout.Params())
	}
	b := Float32Bytes(values)
	if !littleEndian {
		if cap(s.scratch) < len(b) {
			s.scratch = make([]byte, len(b))
		}
		b = s.scratch[:len(b)]
		for i, x := range values {
			binary.LittleEndian.PutUint32(b[4*i:], float32bits(x))
		}
	}
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("write pack values: %w", err)
	}
	s.left -= int64(len(values))
	return nil
}

// Close checks that every value was written.
func (s *StreamWriter) Close() error {
	if s.left != 0 {
		return fmt.Errorf("stream pack: %d of %d values missing", s.left, s.layout.Params())
	}
	return nil
}
