package export

import (
	"errors"
	"fmt"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/pack"
)

// Meta is what an exported file says about where its values came from.
type Meta struct {
	Network    string
	Experiment string
	Round      uint64
	Head       cid.Cid // cid.Undef when the values are not a head's
	Params     cid.Cid // the parameter pack's artifact id, or cid.Undef
}

// Source is one version of the model's parameters, ready to export: the pack's layout and
// its data bytes (tensors in layout order, float32 little-endian, contiguous), usually a
// read-only view of the params artifact's mapped blob. Close it when done.
type Source struct {
	Meta   Meta
	Layout pack.Layout
	Data   []byte
	close  func() error
	pages  *pageDropper // over the mapping Data views, if any (see drop)
}

// drop releases the resident pages of b, a part of Data already exported, and of what was
// exported before it (see pageDropper). An export walks Data front to back, one export
// at a time.
func (s *Source) drop(b []byte) { s.pages.drop(b) }

// Close releases the mapping behind Data, if any. It is safe to call more than once.
func (s *Source) Close() error {
	if s == nil || s.close == nil {
		return nil
	}
	err := s.close()
	s.close = nil
	return err
}

func (s *Source) check() error {
	if s == nil {
		return errors.New("export: nil source")
	}
	if !s.Layout.Canonical() {
		return fmt.Errorf("export %s: tensor names must be unique and ascending", s.describe())
	}
	if want := s.Layout.Params() * 4; int64(len(s.Data)) != want {
		return fmt.Errorf("export %s: %d data bytes for a layout of %d", s.describe(), len(s.Data), want)
	}
	return nil
}

// describe names the source in errors: the head when there is one.
func (s *Source) describe() string {
	if s.Meta.Head.Defined() {
		return fmt.Sprintf("head %s", s.Meta.Head)
	}
	return fmt.Sprintf("round %d", s.Meta.Round)
}

// NewSource exports values held in memory (a snapshot: p's values are not copied, so the
// caller must not change them until the export is done).
func NewSource(meta Meta, p *pack.Pack) (*Source, error) {
	if p == nil {
		return nil, errors.New("export: nil pack")
	}
	s := &Source{Meta: meta, Layout: p.Layout, Data: pack.Float32Bytes(p.Values)}
	if err := s.check(); err != nil {
		return nil, err
	}
	return s, nil
}

// OpenHead maps the parameters of head id from the stores. The params blob is immutable
// in the content-addressed store, so the mapping is the snapshot: nothing is copied. The
// pack's layout must hash to the head's layout hash.
func OpenHead(arts *artifact.Store, heads *chain.Store, id cid.Cid) (*Source, error) {
	_, h, err := heads.Get(id)
	if err != nil {
		return nil, fmt.Errorf("export head %s: %w", id, err)
	}
	pid, err := h.ParamsID()
	if err != nil {
		return nil, fmt.Errorf("export head %s: %w", id, err)
	}
	blob, err := arts.Open(pid)
	if err != nil {
		return nil, fmt.Errorf("export head %s: params %s: %w", id, pid, err)
	}
	f, err := pack.Parse(blob.Bytes())
	if err == nil {
		var p *pack.Pack
		if p, err = pack.FromFile(f); err == nil {
			if got := p.Layout.Hash(); got != h.LayoutHash {
				err = fmt.Errorf("%w: pack has layout %s, head says %s", pack.ErrLayoutMismatch, got, h.LayoutHash)
			} else {
				return &Source{
					Meta:   Meta{Network: h.Network, Experiment: h.Experiment, Round: h.Round, Head: id, Params: pid},
					Layout: p.Layout,
					Data:   f.Data(),
					close:  blob.Close,
					pages:  &pageDropper{m: blob.Bytes()},
				}, nil
			}
		}
	}
	blob.Close()
	return nil, fmt.Errorf("export head %s: params %s: %w", id, pid, err)
}
