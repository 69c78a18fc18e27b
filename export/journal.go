package export

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
)

// The journal (docs/formats.md, "Export journal"):
//
//	magic "P2PEXJ1\n"
//	records: kind byte, uvarint body length, body
//	  'F' file:    uvarint size, name        declares the next file id (0, 1, ...)
//	  'B' block:   uvarint file id, uvarint offset, bytes
//	  'R' rename:  uvarint len(from), from, to
//	  'D' delete:  name
//	  'C' commit:  sha256 of every byte before this record; must be the last record
//
// Only a journal that ends in a commit record whose hash matches is ever applied.
const journalMagic = "P2PEXJ1\n"

const (
	recFile   = 'F'
	recBlock  = 'B'
	recRename = 'R'
	recDelete = 'D'
	recCommit = 'C'
)

// MaxBlockBytes bounds the block size, and with it a journal record.
const MaxBlockBytes = 64 << 20

// maxRecordBody is the largest body a journal record may have: a block with its file id
// and offset.
const maxRecordBody = MaxBlockBytes + 2*binary.MaxVarintLen64

// journalOp is one decoded record. data is valid until the next call of the callback.
type journalOp struct {
	kind byte
	name string // F, B (the file's name), D: the model file; R: the target
	from string // R: the temp file
	size int64  // F, B: the model file's size when the journal was written
	off  int64  // B
	data []byte // B
}

// journalWriter appends records to a new journal and hashes them for the commit.
type journalWriter struct {
	f     *countedFile
	bw    *bufio.Writer
	sum   hash.Hash
	files map[string]uint64
}

// createJournal creates the journal in dir; one must not exist (recovery removed it).
func createJournal(dir string, c *ioCounter) (*journalWriter, error) {
	path := filepath.Join(dir, JournalFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create journal %s: %w", path, err)
	}
	j := &journalWriter{f: &countedFile{File: f, c: c}, sum: sha256.New(), files: map[string]uint64{}}
	j.bw = bufio.NewWriterSize(io.MultiWriter(j.f, j.sum), 1<<20)
	if _, err := j.bw.WriteString(journalMagic); err != nil {
		j.abort()
		return nil, fmt.Errorf("write journal %s: %w", path, err)
	}
	return j, nil
}

func (j *journalWriter) record(kind byte, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	var hdr [1 + binary.MaxVarintLen64]byte
	hdr[0] = kind
	k := 1 + binary.PutUvarint(hdr[1:], uint64(n))
	if _, err := j.bw.Write(hdr[:k]); err != nil {
		return fmt.Errorf("write journal %s: %w", j.f.Name(), err)
	}
	for _, p := range parts {
		if _, err := j.bw.Write(p); err != nil {
			return fmt.Errorf("write journal %s: %w", j.f.Name(), err)
		}
	}
	return nil
}

func uvarint(v uint64) []byte { return binary.AppendUvarint(nil, v) }

// block records the new bytes of one block of file name (of the given size).
func (j *journalWriter) block(name string, size, off int64, data []byte) error {
	id, ok := j.files[name]
	if !ok {
		id = uint64(len(j.files))
		j.files[name] = id
		if err := j.record(recFile, uvarint(uint64(size)), []byte(name)); err != nil {
			return err
		}
	}
	return j.record(recBlock, append(uvarint(id), uvarint(uint64(off))...), data)
}

func (j *journalWriter) rename(from, to string) error {
	return j.record(recRename, uvarint(uint64(len(from))), []byte(from), []byte(to))
}

func (j *journalWriter) remove(name string) error { return j.record(recDelete, []byte(name)) }

// commit appends the commit record and makes the journal durable: after it returns, the
// transaction will complete even if the process dies.
func (j *journalWriter) commit() error {
	if err := j.bw.Flush(); err != nil {
		return fmt.Errorf("write journal %s: %w", j.f.Name(), err)
	}
	sum := j.sum.Sum(nil)
	j.bw.Reset(j.f) // the commit record is not part of what it hashes
	if err := j.record(recCommit, sum); err != nil {
		return err
	}
	return j.finish()
}

// flushUncommitted makes the journal durable without a commit record (crash tests).
func (j *journalWriter) flushUncommitted() error { return j.finish() }

func (j *journalWriter) finish() error {
	if err := j.bw.Flush(); err != nil {
		return fmt.Errorf("write journal %s: %w", j.f.Name(), err)
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("sync journal %s: %w", j.f.Name(), err)
	}
	if err := j.f.Close(); err != nil {
		return fmt.Errorf("close journal %s: %w", j.f.Name(), err)
	}
	// The journal's directory entry must be durable before any model file changes.
	return syncDir(filepath.Dir(j.f.Name()))
}

// abort closes and removes an uncommitted journal.
func (j *journalWriter) abort() {
	j.f.Close()
	os.Remove(j.f.Name())
}

// errNotCommitted is wrapped when a journal does not end in a valid commit record.
var errNotCommitted = errors.New("journal not committed")

// decodeJournal reads a journal of size bytes from r, calling fn (if not nil) for every
// record before the commit. It returns nil only for a complete journal: one that ends in a
// commit record whose hash matches everything before it. Otherwise the error, wrapping
// errNotCommitted, says what is wrong; such a journal was never applied.
//
// fn sees records before the commit is checked, so callers that act on them read the
// journal twice: once with fn nil to check it, once to apply it.
func decodeJournal(r io.Reader, size int64, fn func(journalOp) error) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errNotCommitted, fmt.Sprintf(format, args...))
	}
	br := bufio.NewReaderSize(r, 1<<20)
	sum := sha256.New()
	magic := make([]byte, len(journalMagic))
	if _, err := io.ReadFull(br, magic); err != nil {
		return bad("no magic: %v", err)
	}
	if string(magic) != journalMagic {
		return bad("bad magic %q", magic)
	}
	sum.Write(magic)
	pos := int64(len(magic))
	var names []string
	var sizes []int64
	declared := map[string]bool{}
	var body []byte
	for {
		start := pos
		kind, err := br.ReadByte()
		if err == io.EOF {
			return bad("ends after %d bytes without a commit record", pos)
		}
		if err != nil {
			return bad("read: %v", err)
		}
		n, nlen, err := readMinimalUvarint(br)
		if err != nil {
			return bad("record at %d: length: %v", start, err)
		}
		hdrLen := int64(1 + nlen)
		if n > maxRecordBody || int64(n) > size-start-hdrLen {
			return bad("record at %d: length %d exceeds the journal", start, n)
		}
		if cap(body) < int(n) {
			body = make([]byte, n)
		}
		body = body[:n]
		if _, err := io.ReadFull(br, body); err != nil {
			return bad("record at %d: %v", start, err)
		}
		pos = start + hdrLen + int64(n)
		if kind == recCommit {
			if len(body) != sha256.Size || !bytes.Equal(body, sum.Sum(nil)) {
				return bad("commit record at %d does not match the journal's hash", start)
			}
			if pos != size {
				return bad("%d bytes after the commit record", size-pos)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				return bad("data after the commit record")
			}
			return nil
		}
		sum.Write([]byte{kind})
		sum.Write(binary.AppendUvarint(nil, n))
		sum.Write(body)
		op, err := decodeRecord(kind, body, names, sizes)
		if err != nil {
			return bad("record at %d: %v", start, err)
		}
		if kind == recFile {
			if declared[op.name] {
				return bad("record at %d: file %q declared twice", start, op.name)
			}
			declared[op.name] = true
			names = append(names, op.name)
			sizes = append(sizes, op.size)
		}
		if fn != nil {
			if err := fn(op); err != nil {
				return err
			}
		}
	}
}

// decodeRecord decodes one record body (other than a commit) against the files declared
// so far.
func decodeRecord(kind byte, body []byte, names []string, sizes []int64) (journalOp, error) {
	op := journalOp{kind: kind}
	switch kind {
	case recFile:
		size, k := binary.Uvarint(body)
		if k <= 0 || size > 1<<62 {
			return op, errors.New("file: bad size")
		}
		op.size, op.name = int64(size), string(body[k:])
		if !isModelFile(op.name) || op.name == IndexFile {
			return op, fmt.Errorf("file: %q is not a model file", op.name)
		}
	case recBlock:
		id, k := binary.Uvarint(body)
		if k <= 0 || id >= uint64(len(names)) {
			return op, errors.New("block: unknown file id")
		}
		off, k2 := binary.Uvarint(body[k:])
		if k2 <= 0 {
			return op, errors.New("block: bad offset")
		}
		op.name, op.size, op.data = names[id], sizes[id], body[k+k2:]
		if off > uint64(op.size) || uint64(len(op.data)) > uint64(op.size)-off {
			return op, fmt.Errorf("block: [%d, +%d) outside %s of %d bytes", off, len(op.data), op.name, op.size)
		}
		op.off = int64(off)
	case recRename:
		n, k := binary.Uvarint(body)
		if k <= 0 || n > uint64(len(body)-k) {
			return op, errors.New("rename: bad name length")
		}
		op.from, op.name = string(body[k:k+int(n)]), string(body[k+int(n):])
		if !isTempFile(op.from) || !isModelFile(op.name) {
			return op, fmt.Errorf("rename %q to %q: not a temp file to a model file", op.from, op.name)
		}
	case recDelete:
		op.name = string(body)
		if !isModelFile(op.name) {
			return op, fmt.Errorf("delete: %q is not a model file", op.name)
		}
	default:
		return op, fmt.Errorf("unknown record kind 0x%02x", kind)
	}
	return op, nil
}

// readMinimalUvarint reads a uvarint and returns it with its encoded length, refusing
// non-minimal encodings, so the bytes hashed for the commit are exactly the bytes read.
func readMinimalUvarint(br io.ByteReader) (uint64, int, error) {
	var buf [binary.MaxVarintLen64]byte
	for i := range buf {
		b, err := br.ReadByte()
		if err == io.EOF && i > 0 {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return 0, 0, err
		}
		buf[i] = b
		if b < 0x80 {
			n, k := binary.Uvarint(buf[:i+1])
			if k <= 0 {
				return 0, 0, errors.New("varint overflows 64 bits")
			}
			if k != len(binary.AppendUvarint(nil, n)) {
				return 0, 0, errors.New("non-minimal varint")
			}
			return n, k, nil
		}
	}
	return 0, 0, errors.New("varint longer than 10 bytes")
}
