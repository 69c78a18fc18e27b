package export

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/p2pnode/p2pnode/pack"
)

// FormatVersion is __metadata__["p2pnode_export"] in every exported file.
const FormatVersion = "1"

// reservedCIDLen is the width kept in every header for each CID in the metadata, and
// reservedRoundLen for the round (the digits of the largest uint64). Reserving them keeps
// the header length, and so every tensor's file offset, the same from one head to the
// next, which is what lets a sync rewrite blocks in place.
const (
	reservedCIDLen   = 128
	reservedRoundLen = 20
)

// filePlan is one file of an export: its header and the slice of the source's data it
// holds (shards hold consecutive tensors, so their data is one range of the pack's).
type filePlan struct {
	name       string
	header     []byte            // 8-byte length prefix + JSON + space padding
	tensors    []pack.TensorInfo // offsets relative to this file's first data byte
	begin, end int64             // this file's data within Source.Data
}

func (f *filePlan) size() int64 { return int64(len(f.header)) + f.end - f.begin }

// at returns the n bytes at offset off of the planned file: a view of src when they lie in
// the data, else a copy into buf (which must hold n bytes).
func (f *filePlan) at(src []byte, off int64, n int, buf []byte) []byte {
	h := int64(len(f.header))
	if off >= h {
		b := f.begin + off - h
		return src[b : b+int64(n)]
	}
	buf = buf[:n]
	k := copy(buf, f.header[off:])
	if k < n {
		copy(buf[k:], src[f.begin:f.begin+int64(n-k)])
	}
	return buf
}

// plan is a whole export: its files in order and, when sharded, the index bytes.
type plan struct {
	files []filePlan
	index []byte // nil for a single file
}

// weightMap is tensor name → file name.
func (p *plan) weightMap() map[string]string {
	m := map[string]string{}
	for _, f := range p.files {
		for _, t := range f.tensors {
			m[t.Name] = f.name
		}
	}
	return m
}

func (p *plan) has(name string) bool {
	if name == IndexFile {
		return p.index != nil
	}
	for _, f := range p.files {
		if f.name == name {
			return true
		}
	}
	return false
}

// makePlan assigns tensors to files and encodes the headers. Tensors go to shards in pack
// order, a new shard starting when the next tensor would take the current one past
// shardBytes of data (a tensor larger than that gets a shard of its own), so the plan is a
// pure function of the layout and the shard size.
func makePlan(src *Source, shardBytes int64) (*plan, error) {
	if err := src.check(); err != nil {
		return nil, err
	}
	type group struct{ first, last int } // tensor indices, inclusive
	var groups []group
	var cur int64
	for i, e := range src.Layout {
		n := e.Elements() * 4
		if len(groups) == 0 || (cur > 0 && cur+n > shardBytes) {
			groups = append(groups, group{i, i})
			cur = 0
		}
		groups[len(groups)-1].last = i
		cur += n
	}
	if len(groups) == 0 { // a model without tensors is still one (empty) file
		groups = append(groups, group{0, -1})
	}
	p := &plan{}
	var off int64
	for g, gr := range groups {
		fp := filePlan{name: SingleFile, begin: off}
		if len(groups) > 1 {
			fp.name = ShardName(g+1, len(groups))
		}
		var rel int64
		for _, e := range src.Layout[gr.first : gr.last+1] {
			n := e.Elements() * 4
			fp.tensors = append(fp.tensors, pack.TensorInfo{Name: e.Name, DType: pack.F32, Shape: e.Shape, Begin: rel, End: rel + n})
			rel += n
		}
		off += rel
		fp.end = off
		hdr, err := encodeHeader(fp.tensors, src.Meta, src.Layout.Hash())
		if err != nil {
			return nil, fmt.Errorf("export %s: %s: %w", src.describe(), fp.name, err)
		}
		fp.header = hdr
		p.files = append(p.files, fp)
	}
	if len(p.files) > 1 {
		idx, err := encodeIndex(p.weightMap(), off, src.Layout.Hash())
		if err != nil {
			return nil, fmt.Errorf("export %s: %w", src.describe(), err)
		}
		p.index = idx
	}
	return p, nil
}

// headerMeta is the __metadata__ of an exported file. "format" is "pt" because
// transformers refuses safetensors whose format is anything else; our own format marker
// is "p2pnode_export".
func headerMeta(m Meta, layoutHash string) map[string]string {
	str := func(c interface{ String() string }, defined bool) string {
		if !defined {
			return ""
		}
		return c.String()
	}
	return map[string]string{
		"format":         "pt",
		"p2pnode_export": FormatVersion,
		"network":        m.Network,
		"experiment":     m.Experiment,
		"round":          strconv.FormatUint(m.Round, 10),
		"head":           str(m.Head, m.Head.Defined()),
		"params":         str(m.Params, m.Params.Defined()),
		"layout_hash":    layoutHash,
	}
}

// encodeHeader returns the file's header: canonical JSON (pack.EncodeHeader's), padded
// with spaces to the length it would have with the widest round and CIDs, rounded up to 8
// so the data stays 8-aligned.
func encodeHeader(tensors []pack.TensorInfo, m Meta, layoutHash string) ([]byte, error) {
	meta := headerMeta(m, layoutHash)
	for _, k := range []string{"head", "params"} {
		if len(meta[k]) > reservedCIDLen {
			return nil, fmt.Errorf("metadata %s %q is longer than the %d characters reserved for it", k, meta[k], reservedCIDLen)
		}
	}
	widest := headerMeta(m, layoutHash)
	widest["round"] = strings.Repeat("9", reservedRoundLen)
	widest["head"] = strings.Repeat("x", reservedCIDLen)
	widest["params"] = strings.Repeat("x", reservedCIDLen)
	capJSON, err := headerJSON(tensors, widest)
	if err != nil {
		return nil, err
	}
	js, err := headerJSON(tensors, meta)
	if err != nil {
		return nil, err
	}
	capacity := (len(capJSON) + 7) &^ 7
	out := make([]byte, 8, 8+capacity)
	binary.LittleEndian.PutUint64(out, uint64(capacity))
	out = append(out, js...)
	for len(out) < 8+capacity {
		out = append(out, ' ')
	}
	return out, nil
}

// headerJSON is the canonical header JSON without the length prefix or padding.
func headerJSON(tensors []pack.TensorInfo, meta map[string]string) ([]byte, error) {
	b, err := pack.EncodeHeader(tensors, meta)
	if err != nil {
		return nil, err
	}
	// The JSON ends in '}', so trimming the spaces removes exactly the padding.
	return bytes.TrimRight(b[8:], " "), nil
}
