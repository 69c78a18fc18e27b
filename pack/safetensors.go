package pack

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxHeaderBytes bounds the JSON header we are willing to parse.
const MaxHeaderBytes = 100 << 20

// ErrMalformed is wrapped by every error about bytes that are not valid safetensors.
var ErrMalformed = errors.New("malformed safetensors")

// DType is a safetensors element type.
type DType string

// The element types we read and write.
const (
	F64  DType = "F64"
	F32  DType = "F32"
	F16  DType = "F16"
	BF16 DType = "BF16"
	I64  DType = "I64"
	I32  DType = "I32"
	I16  DType = "I16"
	I8   DType = "I8"
	U8   DType = "U8"
	Bool DType = "BOOL"
)

// Size is the number of bytes of one element, or 0 for an unknown type.
func (d DType) Size() int {
	switch d {
	case F64, I64:
		return 8
	case F32, I32:
		return 4
	case F16, BF16, I16:
		return 2
	case I8, U8, Bool:
		return 1
	}
	return 0
}

// TensorInfo describes one tensor of a safetensors file. Begin and End are byte offsets
// relative to the first data byte.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int64
	Begin int64
	End   int64
}

// Elements is the product of the shape (1 for a scalar).
func (t TensorInfo) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Header is a parsed safetensors header: tensors sorted by Begin, and the metadata.
type Header struct {
	Tensors  []TensorInfo
	Metadata map[string]string
	// DataStart is the file offset of the first data byte (8 + header length).
	DataStart int64
}

// DataSize is the number of data bytes the header describes.
func (h *Header) DataSize() int64 {
	var end int64
	for _, t := range h.Tensors {
		end = max(end, t.End)
	}
	return end
}

// Find returns the tensor with that name.
func (h *Header) Find(name string) (TensorInfo, bool) {
	for _, t := range h.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

type jsonTensor struct {
	DType       DType    `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// ReadHeaderLen reads the 8-byte length prefix and checks it against limits and, when
// fileSize >= 0, against the file's size.
func ReadHeaderLen(prefix []byte, fileSize int64) (int64, error) {
	if len(prefix) < 8 {
		return 0, fmt.Errorf("%w: %d bytes is shorter than the 8-byte header length", ErrMalformed, len(prefix))
	}
	n := binary.LittleEndian.Uint64(prefix[:8])
	if n < 2 || n > MaxHeaderBytes {
		return 0, fmt.Errorf("%w: header length %d out of range [2, %d]", ErrMalformed, n, MaxHeaderBytes)
	}
	if fileSize >= 0 && int64(n)+8 > fileSize {
		return 0, fmt.Errorf("%w: header length %d exceeds file size %d", ErrMalformed, n, fileSize)
	}
	return int64(n), nil
}

// ParseHeader parses a safetensors header. buf must hold at least the prefix and the header;
// fileSize is the total size of the file (data included) and is used to bound offsets.
func ParseHeader(buf []byte, fileSize int64) (*Header, error) {
	n, err := ReadHeaderLen(buf, fileSize)
	if err != nil {
		return nil, err
	}
	if int64(len(buf)) < 8+n {
		return nil, fmt.Errorf("%w: truncated header: need %d bytes, have %d", ErrMalformed, 8+n, len(buf))
	}
	raw := bytes.TrimRight(buf[8:8+n], " ")
	if len(raw) == 0 || raw[0] != '{' || !utf8.Valid(raw) {
		return nil, fmt.Errorf("%w: header is not a UTF-8 JSON object", ErrMalformed)
	}
	var entries map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&entries); err != nil {
		return nil, fmt.Errorf("%w: header JSON: %v", ErrMalformed, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after header JSON", ErrMalformed)
	}
	h := &Header{DataStart: 8 + n}
	dataLen := fileSize - h.DataStart
	for name, msg := range entries {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &h.Metadata); err != nil {
				return nil, fmt.Errorf("%w: __metadata__ must map strings to strings: %v", ErrMalformed, err)
			}
			continue
		}
		var jt jsonTensor
		d := json.NewDecoder(bytes.NewReader(msg))
		d.DisallowUnknownFields()
		if err := d.Decode(&jt); err != nil {
			return nil, fmt.Errorf("%w: tensor %q: %v", ErrMalformed, name, err)
		}
		t := TensorInfo{Name: name, DType: jt.DType, Shape: jt.Shape, Begin: jt.DataOffsets[0], End: jt.DataOffsets[1]}
		if err := checkTensor(t, dataLen); err != nil {
			return nil, err
		}
		h.Tensors = append(h.Tensors, t)
	}
	sort.Slice(h.Tensors, func(i, j int) bool {
		a, b := h.Tensors[i], h.Tensors[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		return a.End < b.End
	})
	for i := 1; i < len(h.Tensors); i++ {
		if prev, cur := h.Tensors[i-1], h.Tensors[i]; cur.Begin < prev.End {
			return nil, fmt.Errorf("%w: tensors %q and %q overlap", ErrMalformed, prev.Name, cur.Name)
		}
	}
	return h, nil
}

func checkTensor(t TensorInfo, dataLen int64) error {
	if t.Name == "" {
		return fmt.Errorf("%w: empty tensor name", ErrMalformed)
	}
	size := int64(t.DType.Size())
	if size == 0 {
		return fmt.Errorf("%w: tensor %q: unknown dtype %q", ErrMalformed, t.Name, t.DType)
	}
	elems := int64(1)
	for _, d := range t.Shape {
		if d < 0 || (d > 0 && elems > math.MaxInt64/size/d) {
			return fmt.Errorf("%w: tensor %q: bad shape %v", ErrMalformed, t.Name, t.Shape)
		}
		elems *= d
	}
	if t.Begin < 0 || t.End < t.Begin || (dataLen >= 0 && t.End > dataLen) {
		return fmt.Errorf("%w: tensor %q: data offsets [%d, %d] outside data of %d bytes", ErrMalformed, t.Name, t.Begin, t.End, dataLen)
	}
	if t.End-t.Begin != elems*size {
		return fmt.Errorf("%w: tensor %q: %d bytes for shape %v of %s (want %d)", ErrMalformed, t.Name, t.End-t.Begin, t.Shape, t.DType, elems*size)
	}
	return nil
}

// EncodeHeader returns the 8-byte prefix and the canonical header for tensors (which must
// already carry their offsets): sorted keys, no whitespace, padded with spaces so that the
// data starts at a multiple of 8.
func EncodeHeader(tensors []TensorInfo, meta map[string]string) ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	names := make([]string, 0, len(tensors)+1)
	byName := make(map[string]TensorInfo, len(tensors))
	for _, t := range tensors {
		if _, dup := byName[t.Name]; dup || t.Name == "__metadata__" {
			return nil, fmt.Errorf("encode safetensors header: duplicate or reserved tensor name %q", t.Name)
		}
		byName[t.Name] = t
		names = append(names, t.Name)
	}
	if len(meta) > 0 {
		names = append(names, "__metadata__")
	}
	slices.Sort(names)
	for i, name := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		writeJSONString(&b, name)
		b.WriteByte(':')
		if name == "__metadata__" {
			keys := make([]string, 0, len(meta))
			for k := range meta {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			b.WriteByte('{')
			for j, k := range keys {
				if j > 0 {
					b.WriteByte(',')
				}
				writeJSONString(&b, k)
				b.WriteByte(':')
				writeJSONString(&b, meta[k])
			}
			b.WriteByte('}')
			continue
		}
		t := byName[name]
		b.WriteString(`{"data_offsets":[`)
		b.WriteString(strconv.FormatInt(t.Begin, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(t.End, 10))
		b.WriteString(`],"dtype":`)
		writeJSONString(&b, string(t.DType))
		b.WriteString(`,"shape":[`)
		for j, d := range t.Shape {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(d, 10))
		}
		b.WriteString("]}")
	}
	b.WriteByte('}')
	n := b.Len()
	pad := (8 - n%8) % 8
	out := make([]byte, 8, 8+n+pad)
	binary.LittleEndian.PutUint64(out, uint64(n+pad))
	out = append(out, b.String()...)
	for range pad {
		out = append(out, ' ')
	}
	return out, nil
}

// writeJSONString writes s as a JSON string without HTML escaping, so that Go and Python
// writers agree on the bytes for plain names.
func writeJSONString(b *strings.Builder, s string) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	b.Write(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
}

// Tensor is a named tensor to write: its raw little-endian bytes.
type Tensor struct {
	Name  string
	DType DType
	Shape []int64
	Data  []byte
}

// Write writes tensors as a safetensors file in the order given (the caller picks the order;
// packs use name order).
func Write(w io.Writer, tensors []Tensor, meta map[string]string) error {
	infos := make([]TensorInfo, len(tensors))
	var off int64
	for i, t := range tensors {
		infos[i] = TensorInfo{Name: t.Name, DType: t.DType, Shape: t.Shape, Begin: off, End: off + int64(len(t.Data))}
		if err := checkTensor(infos[i], -1); err != nil {
			return fmt.Errorf("write safetensors: %w", err)
		}
		off += int64(len(t.Data))
	}
	hdr, err := EncodeHeader(infos, meta)
	if err != nil {
		return err
	}
	if _, err := w.Write(hdr); err != nil {
		return fmt.Errorf("write safetensors header: %w", err)
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return fmt.Errorf("write safetensors tensor %q: %w", t.Name, err)
		}
	}
	return nil
}
