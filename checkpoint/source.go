package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
)

// A Source is a large blob the writer reads while it writes the blob (Snapshot.Streams),
// so that saving a model-sized state costs the writer one buffer, not a copy of the state
// held from the snapshot until the write.
type Source interface {
	// WriteTo writes the blob's bytes to w. The writer checks the count against Size.
	WriteTo(w io.Writer) (int64, error)
	// Size is how many bytes WriteTo writes; -1 if not known in advance.
	Size() int64
	// Describe names the source in errors (a file's path, say).
	Describe() string
	// Close releases the source. The checkpointer calls it exactly once for every source
	// it was handed: after the blob is written, when the write failed, or when the
	// snapshot was dropped (superseded, abandoned, refused).
	Close() error
}

// ErrNoBlob, returned by a Source's WriteTo before it writes anything, leaves its blob out
// of the generation (the state it would hold does not exist at the moment).
var ErrNoBlob = errors.New("checkpoint source has no blob")

// streamBuf is the copy buffer for file sources: the artifact store's default chunk size,
// so the store hashes whole chunks in place.
const streamBuf = 1 << 20

// fileSource streams an open file.
type fileSource struct {
	f    *os.File
	size int64
}

// OpenFile opens path as a Source for Snapshot.Streams. The file is opened now, so it may
// be removed or replaced before the writer gets to it: the writer reads the bytes that
// were there (the open descriptor keeps them), and a file that was truncated in place is
// an error naming it, never a short blob.
func OpenFile(path string) (Source, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint source: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("checkpoint source %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("checkpoint source %s: not a regular file", path)
	}
	return &fileSource{f: f, size: st.Size()}, nil
}

func (s *fileSource) Size() int64      { return s.size }
func (s *fileSource) Describe() string { return s.f.Name() }
func (s *fileSource) Close() error     { return s.f.Close() }

// WriteTo copies the file from its start in streamBuf blocks (read(2) into one buffer:
// the page cache holds the file, not this process). A file that ends early was truncated
// after it was opened: an error naming it, never a short blob.
func (s *fileSource) WriteTo(w io.Writer) (int64, error) {
	n, err := io.CopyBuffer(w, io.NewSectionReader(s.f, 0, s.size), make([]byte, streamBuf))
	if err == nil && n < s.size {
		err = fmt.Errorf("%s is truncated: %d of %d bytes", s.f.Name(), n, s.size)
	}
	return n, err
}

// ctxWriter stops a streamed blob between blocks once ctx ends (a Save given up).
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	var n int
	for len(p) > 0 {
		if err := c.ctx.Err(); err != nil {
			return n, err
		}
		k, err := c.w.Write(p[:min(len(p), streamBuf)])
		n += k
		if err != nil {
			return n, err
		}
		p = p[k:]
	}
	return n, nil
}

// countWriter counts what reaches w, whatever the source reports.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.n += int64(k)
	return k, err
}
