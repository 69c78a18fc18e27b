package pack

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Format is the value of __metadata__.format in every pack.
const Format = "p2ptrain-pack/1"

// ErrLayoutMismatch is returned when two packs (or a pack and a model) disagree on layout.
var ErrLayoutMismatch = errors.New("pack layout mismatch")

// Entry is one tensor of a layout.
type Entry struct {
	Name  string
	Shape []int64
}

// Elements is the product of the shape.
func (e Entry) Elements() int64 {
	n := int64(1)
	for _, d := range e.Shape {
		n *= d
	}
	return n
}

// Layout is the ordered list of a pack's tensors.
type Layout []Entry

// String is the layout string defined in docs/formats.md.
func (l Layout) String() string {
	var b strings.Builder
	for _, e := range l {
		b.WriteString(e.Name)
		b.WriteString(":F32:")
		for i, d := range e.Shape {
			if i > 0 {
				b.WriteByte('x')
			}
			b.WriteString(strconv.FormatInt(d, 10))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// Hash is the hex sha256 of the layout string.
func (l Layout) Hash() string {
	sum := sha256.Sum256([]byte(l.String()))
	return hex.EncodeToString(sum[:])
}

// Params is the total number of float32 values.
func (l Layout) Params() int64 {
	var n int64
	for _, e := range l {
		n += e.Elements()
	}
	return n
}

// Canonical reports whether names are strictly ascending (the pack order).
func (l Layout) Canonical() bool {
	for i := 1; i < len(l); i++ {
		if l[i-1].Name >= l[i].Name {
			return false
		}
	}
	return true
}

// Pack is a parameter pack: a layout and its values as one flat vector in layout order.
// Values may be a view into a mapped file; see Close.
type Pack struct {
	Layout Layout
	Values []float32
	Meta   map[string]string
	file   *File
}

// New makes a pack over values (not copied). len(values) must equal layout.Params().
func New(layout Layout, values []float32, meta map[string]string) (*Pack, error) {
	if !layout.Canonical() {
		return nil, fmt.Errorf("new pack: tensor names must be unique and ascending")
	}
	if int64(len(values)) != layout.Params() {
		return nil, fmt.Errorf("new pack: %d values for a layout of %d parameters", len(values), layout.Params())
	}
	return &Pack{Layout: layout, Values: values, Meta: meta}, nil
}

// FromFile checks that f is a pack and returns its values as a view into f.
func FromFile(f *File) (*Pack, error) {
	layout, err := LayoutOf(f.Header, int64(len(f.Data())))
	if err != nil {
		return nil, err
	}
	values, err := Float32s(f.Data())
	if err != nil {
		return nil, err
	}
	return &Pack{Layout: layout, Values: values, Meta: f.Header.Metadata, file: f}, nil
}

// ParamCount is the number of values of the pack at path, read from its header alone (0
// when it cannot be read as a pack).
func ParamCount(path string) int64 {
	r, err := OpenReader(path)
	if err != nil {
		return 0
	}
	defer r.Close()
	l, err := LayoutOf(r.Header, r.DataLen())
	if err != nil {
		return 0
	}
	return l.Params()
}

// LayoutOf checks that a safetensors header with dataLen data bytes describes a pack (F32
// tensors stored contiguously in name order, covering all the data, with a matching
// layout_hash if the header names one) and returns its layout.
func LayoutOf(h *Header, dataLen int64) (Layout, error) {
	layout := make(Layout, 0, len(h.Tensors))
	var next int64
	for _, t := range h.Tensors {
		if t.DType != F32 {
			return nil, fmt.Errorf("%w: not a pack: tensor %q is %s, packs hold F32 only", ErrMalformed, t.Name, t.DType)
		}
		if t.Begin != next {
			return nil, fmt.Errorf("%w: not a pack: tensor %q starts at %d, expected %d (packs are contiguous)", ErrMalformed, t.Name, t.Begin, next)
		}
		next = t.End
		layout = append(layout, Entry{Name: t.Name, Shape: t.Shape})
	}
	if !layout.Canonical() {
		return nil, fmt.Errorf("%w: not a pack: tensors are not stored in name order", ErrMalformed)
	}
	if dataLen != next {
		return nil, fmt.Errorf("%w: not a pack: %d data bytes, tensors cover %d", ErrMalformed, dataLen, next)
	}
	if want, ok := h.Metadata["layout_hash"]; ok && want != layout.Hash() {
		return nil, fmt.Errorf("%w: header says layout_hash %s but tensors hash to %s", ErrLayoutMismatch, want, layout.Hash())
	}
	return layout, nil
}

// Load maps a pack file. Close the pack when done with its values.
func Load(path string) (*Pack, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	p, err := FromFile(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("pack %s: %w", path, err)
	}
	return p, nil
}

// Close releases the mapping behind Values, if any.
func (p *Pack) Close() error {
	if p == nil || p.file == nil {
		return nil
	}
	return p.file.Close()
}

// CheckLayout returns ErrLayoutMismatch naming both hashes when p's layout differs from want.
func (p *Pack) CheckLayout(want Layout) error {
	if got, w := p.Layout.Hash(), want.Hash(); got != w {
		return fmt.Errorf("%w: pack has layout %s, expected %s", ErrLayoutMismatch, got, w)
	}
	return nil
}

// NameAt names the tensor that holds value i of the concatenated values ("" past the end).
func (l Layout) NameAt(i int64) string {
	var off int64
	for _, e := range l {
		off += e.Elements()
		if i < off {
			return e.Name
		}
	}
	return ""
}

// Tensor returns the values of one tensor (a view).
func (p *Pack) Tensor(name string) ([]float32, bool) {
	var off int64
	for _, e := range p.Layout {
		n := e.Elements()
		if e.Name == name {
			return p.Values[off : off+n], true
		}
		off += n
	}
	return nil, false
}

// Finite returns the name of the first tensor holding a NaN or Inf, or "" if none does.
func (p *Pack) Finite() string {
	var off int64
	for _, e := range p.Layout {
		n := e.Elements()
		for _, v := range p.Values[off : off+n] {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return e.Name
			}
		}
		off += n
	}
	return ""
}

// Metadata returns the metadata a canonical pack carries: extra plus format and layout hash.
func (l Layout) Metadata(extra map[string]string) map[string]string {
	meta := make(map[string]string, len(extra)+2)
	for k, v := range extra {
		meta[k] = v
	}
	meta["format"] = Format
	meta["layout_hash"] = l.Hash()
	return meta
}

// WriteTo writes the canonical encoding of p (its Meta plus format and layout hash).
func (p *Pack) WriteTo(w io.Writer) (int64, error) {
	tensors := make([]Tensor, len(p.Layout))
	var off int64
	for i, e := range p.Layout {
		n := e.Elements()
		tensors[i] = Tensor{Name: e.Name, DType: F32, Shape: e.Shape, Data: Float32Bytes(p.Values[off : off+n])}
		off += n
	}
	cw := &countingWriter{w: w}
	err := Write(cw, tensors, p.Layout.Metadata(p.Meta))
	return cw.n, err
}

// WriteFile writes p canonically to path through a temporary file and a rename, so a reader
// never sees a half-written pack.
func (p *Pack) WriteFile(path string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write pack %s: %w", path, err)
	}
	bw := bufio.NewWriterSize(tmp, 1<<20)
	_, err = p.WriteTo(bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write pack %s: %w", path, err)
	}
	return nil
}

// SameLayout reports whether a and b have equal layouts.
func SameLayout(a, b Layout) bool {
	return slices.EqualFunc(a, b, func(x, y Entry) bool { return x.Name == y.Name && slices.Equal(x.Shape, y.Shape) })
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

func float32bits(f float32) uint32     { return math.Float32bits(f) }
func float32frombits(b uint32) float32 { return math.Float32frombits(b) }
