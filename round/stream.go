package round

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/internal/parallel"
	"github.com/p2pnode/p2pnode/pack"
)

// StreamBlock is the number of values a streaming merge reads from each input at a time:
// a multiple of parallel.ChunkLen (so reductions keep their chunk order) and of the
// default int8 block. At 1 MiB of fp32 per input, a merge of K contributions holds about
// 2·K MiB of blocks whatever the model size.
const StreamBlock = 4 * parallel.ChunkLen

// deltaSource reads an encoded pseudo-gradient from the store a range of values at a time
// with positioned reads, decoding only the bytes that cover the range.
type deltaSource struct {
	id      cid.Cid
	r       *pack.Reader
	enc     diloco.Encoded // codec, N, block size; no data
	dataT   pack.TensorInfo
	scalesT pack.TensorInfo
	data    *[]byte // raw bytes of the range, shared by the sources of one merge
	scales  []float32
	sbytes  []byte
	scratch []float32
	workers int
	// sparse holds a whole sparse contribution (a few percent of the model), checked
	// record by record when opened, so that no block fails to decode halfway through.
	sparse diloco.Encoded
	raw    []byte
}

// openDelta opens contribution id for streaming and checks it against the base layout.
// The file must have the size its manifest records, so a blob truncated on disk is caught
// here rather than halfway through a merge.
// Sources that are read one after the other may share buf, the raw bytes of a range, so
// that a merge holds one such buffer rather than one per contribution.
func openDelta(store *artifact.Store, id cid.Cid, layoutHash string, n, workers int, buf *[]byte) (*deltaSource, error) {
	if buf == nil {
		buf = new([]byte)
	}
	m, err := store.Manifest(id)
	if err != nil {
		return nil, err
	}
	r, err := pack.OpenReader(store.BlobPath(id))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", id, err)
	}
	if size := r.Header.DataStart + r.DataLen(); uint64(size) != m.Size {
		r.Close()
		return nil, fmt.Errorf("%w: artifact %s is %d bytes on disk, manifest says %d", artifact.ErrCorrupt, id, size, m.Size)
	}
	enc, dataT, scalesT, err := parseDeltaHeader(r.Header, layoutHash, n)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("%s: %w", id, err)
	}
	if enc.Codec == diloco.Sparse {
		defer r.Close()
		raw, err := os.ReadFile(store.BlobPath(id))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", id, err)
		}
		if uint64(len(raw)) != m.Size {
			return nil, fmt.Errorf("%w: artifact %s is %d bytes on disk, manifest says %d", artifact.ErrCorrupt, id, len(raw), m.Size)
		}
		e, err := ParseDelta(raw, layoutHash, n)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", id, err)
		}
		if err := e.CheckRecords(workers); err != nil {
			return nil, fmt.Errorf("%s: %w", id, err)
		}
		return &deltaSource{id: id, enc: e, sparse: e, raw: raw, workers: workers}, nil
	}
	return &deltaSource{id: id, r: r, enc: enc, dataT: dataT, scalesT: scalesT, workers: workers, data: buf}, nil
}

// encoding describes the contribution's encoding: codec, length, block length and, for
// the sparse codec, the values kept per block.
func (d *deltaSource) encoding() diloco.Encoded {
	if d.sparse.Codec == diloco.Sparse {
		return d.sparse
	}
	return d.enc
}

// read decodes values [lo, lo+len(dst)) into dst: the bits a full decode gives there.
func (d *deltaSource) read(lo int, dst []float32) error {
	hi := lo + len(dst)
	align := d.enc.Align()
	alo := lo - lo%align
	out := dst
	if alo != lo {
		// The range starts inside an int8 block: decode from the block's start.
		if cap(d.scratch) < hi-alo {
			d.scratch = make([]float32, hi-alo)
		}
		out = d.scratch[:hi-alo]
	}
	if d.sparse.Codec == diloco.Sparse {
		if err := diloco.DecodeRange(d.sparse, alo, out, d.workers); err != nil {
			return fmt.Errorf("decode %s: %w", d.id, err)
		}
		if alo != lo {
			copy(dst, out[lo-alo:])
		}
		return nil
	}
	s, err := d.enc.Span(alo, hi)
	if err != nil {
		return fmt.Errorf("read %s: %w", d.id, err)
	}
	nd := s.DataEnd - s.DataBegin
	if cap(*d.data) < nd {
		*d.data = make([]byte, nd)
	}
	data := (*d.data)[:nd]
	if err := d.r.ReadTensor(d.dataT, int64(s.DataBegin), data); err != nil {
		return fmt.Errorf("read %s: %w", d.id, err)
	}
	var scales []float32
	if ns := s.ScaleEnd - s.ScaleBegin; ns > 0 {
		if cap(d.sbytes) < 4*ns {
			d.sbytes, d.scales = make([]byte, 4*ns), make([]float32, ns)
		}
		b := d.sbytes[:4*ns]
		if err := d.r.ReadTensor(d.scalesT, 4*int64(s.ScaleBegin), b); err != nil {
			return fmt.Errorf("read %s: %w", d.id, err)
		}
		scales = d.scales[:ns]
		for i := range scales {
			scales[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	}
	if err := diloco.Decode(s.View(d.enc, data, scales, nil), out, d.workers); err != nil {
		return fmt.Errorf("decode %s: %w", d.id, err)
	}
	if alo != lo {
		copy(dst, out[lo-alo:])
	}
	return nil
}

func (d *deltaSource) Close() error {
	if d.r == nil {
		return nil
	}
	return d.r.Close()
}

// refValues reads a delta source as the reference vector of a screening.
type refValues struct{ d *deltaSource }

func (r refValues) ReadValues(lo int64, dst []float32) error { return r.d.read(int(lo), dst) }
