package export

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/pack"
)

// ErrMismatch is returned by VerifyDir when the directory does not hold the head's values.
var ErrMismatch = errors.New("model does not match the head")

// HeadCheck is what VerifyHead established.
type HeadCheck struct {
	Head       cid.Cid
	Round      uint64
	Params     cid.Cid
	Size       uint64 // bytes of the params artifact
	Chunks     int
	LayoutHash string
	Tensors    int
	Parameters int64
}

// VerifyHead recomputes the parameter hash of head id: every chunk of the params artifact
// against its manifest (and the manifest against the artifact id), then the pack's layout
// hash against the head's.
func VerifyHead(arts *artifact.Store, heads *chain.Store, id cid.Cid) (*HeadCheck, error) {
	_, h, err := heads.Get(id)
	if err != nil {
		return nil, fmt.Errorf("verify head %s: %w", id, err)
	}
	pid, err := h.ParamsID()
	if err != nil {
		return nil, fmt.Errorf("verify head %s: %w", id, err)
	}
	m, err := arts.Manifest(pid)
	if err != nil {
		return nil, fmt.Errorf("verify head %s: params %s: %w", id, pid, err)
	}
	if err := arts.Verify(pid); err != nil {
		return nil, fmt.Errorf("verify head %s: params %s: %w", id, pid, err)
	}
	src, err := OpenHead(arts, heads, id) // checks the layout hash against the head
	if err != nil {
		return nil, fmt.Errorf("verify %w", err)
	}
	defer src.Close()
	return &HeadCheck{
		Head: id, Round: h.Round, Params: pid, Size: m.Size, Chunks: len(m.Chunks),
		LayoutHash: h.LayoutHash, Tensors: len(src.Layout), Parameters: src.Layout.Params(),
	}, nil
}

// DirCheck is what VerifyDir found.
type DirCheck struct {
	Dir       string
	Files     []string
	Tensors   int
	Recovered Recovery
	// Problems lists every difference from the source (empty when the directory matches).
	Problems []string
	// Notes are differences that do not make the values wrong (metadata of another head
	// with the same values).
	Notes []string
}

// maxProblems bounds the report of a badly wrong directory.
const maxProblems = 50

// VerifyDir checks that dir holds exactly src's tensors: the same names, F32 with the same
// shapes, and bytes whose sha256 equals that of the source's bytes. It recovers an
// interrupted export first. The error wraps ErrMismatch when values differ, and names the
// file for a directory that is not a readable model.
func VerifyDir(dir string, src *Source, log *slog.Logger) (*DirCheck, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := src.check(); err != nil {
		return nil, err
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	dc := &DirCheck{Dir: dir}
	if dc.Recovered, err = recoverLocked(dir, newCounter(nil), log); err != nil {
		return nil, err
	}
	ex, err := readExisting(dir)
	if err != nil {
		return nil, fmt.Errorf("verify %s: %w", dir, err)
	}
	dc.Files = ex.fileNames
	problem := func(format string, args ...any) {
		if len(dc.Problems) < maxProblems {
			dc.Problems = append(dc.Problems, fmt.Sprintf(format, args...))
		}
	}
	fileOf := func(tensor string) (string, bool) {
		if ex.index == nil {
			return SingleFile, true
		}
		f, ok := ex.index.weightMap[tensor]
		return f, ok
	}
	wanted := map[string]bool{}
	files := map[string]*pack.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	var off int64
	for _, e := range src.Layout {
		n := e.Elements() * 4
		want := src.Data[off : off+n]
		off += n
		wanted[e.Name] = true
		name, ok := fileOf(e.Name)
		if !ok {
			problem("%s has no entry for tensor %q", filepath.Join(dir, IndexFile), e.Name)
			continue
		}
		f, ok := files[name]
		if !ok {
			if f, err = pack.Open(filepath.Join(dir, name)); err != nil {
				return nil, fmt.Errorf("verify %s: %w", dir, err)
			}
			files[name] = f
			if note := metaNote(f.Header.Metadata, src.Meta); note != "" {
				dc.Notes = append(dc.Notes, fmt.Sprintf("%s: %s", name, note))
			}
		}
		t, ok := f.Header.Find(e.Name)
		if !ok {
			problem("%s has no tensor %q", name, e.Name)
			continue
		}
		dc.Tensors++
		if t.DType != pack.F32 || !slices.Equal(t.Shape, e.Shape) {
			problem("%s: tensor %q is %s%v, the head's F32%v", name, e.Name, t.DType, t.Shape, e.Shape)
			continue
		}
		if got, exp := sha256.Sum256(f.Bytes(t)), sha256.Sum256(want); got != exp {
			problem("%s: tensor %q: sha256 %x, the head's %x", name, e.Name, got[:8], exp[:8])
		}
	}
	for _, name := range ex.fileNames {
		f, ok := files[name]
		if !ok {
			if f, err = pack.Open(filepath.Join(dir, name)); err != nil {
				return nil, fmt.Errorf("verify %s: %w", dir, err)
			}
			files[name] = f
		}
		for _, t := range f.Header.Tensors {
			if !wanted[t.Name] {
				problem("%s holds tensor %q, which the head does not have", name, t.Name)
			}
		}
	}
	if len(dc.Problems) > 0 {
		return dc, fmt.Errorf("verify %s against %s: %w: %d problems, first: %s", dir, src.describe(), ErrMismatch, len(dc.Problems), dc.Problems[0])
	}
	return dc, nil
}

// metaNote describes metadata naming another head than the source's.
func metaNote(md map[string]string, m Meta) string {
	if !m.Head.Defined() {
		return ""
	}
	if got := md["head"]; got != m.Head.String() {
		return fmt.Sprintf("metadata names head %q (round %s), not %s", got, md["round"], m.Head)
	}
	return ""
}
