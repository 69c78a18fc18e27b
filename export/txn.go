package export

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/p2pnode/p2pnode/internal/progress"
)

// txn is one transaction on a model directory.
type txn struct {
	dir  string
	src  *Source
	p    *plan
	c    *ioCounter
	opts Options
	a    *applier

	blocks  []blockAction // files patched in place
	renames [][2]string   // temp → model file
	stale   []string      // model files the export does not have
	temps   []string      // temp files written (removed if we fail before commit)
	j       *journalWriter
	commit  bool // the journal is committed: failures no longer roll back
	// task shows the model files' bytes compared or written (Options.Progress).
	task progress.Task
}

type blockAction struct {
	fp   *filePlan
	diff *fileDiff
	rep  *FileReport
}

func (t *txn) run(ctx context.Context, ex *existingModel, rep *Report) error {
	if err := t.prepare(ctx, ex, rep); err != nil {
		return err
	}
	if len(t.blocks) == 0 && len(t.renames) == 0 && len(t.stale) == 0 {
		return nil // the directory already holds this export
	}
	before := t.c.written
	if err := t.writeJournal(ctx); err != nil {
		return err
	}
	rep.JournalBytes = t.c.written - before
	if t.opts.faults.crash(crashAfterCommit) {
		return errCrash
	}
	if err := t.apply(); err != nil {
		return fmt.Errorf("%w (the journal %s is kept: the next export or verify of the directory finishes it)", err, filepath.Join(t.dir, JournalFile))
	}
	if err := os.Remove(filepath.Join(t.dir, JournalFile)); err != nil {
		// Harmless: re-applying the journal later is idempotent.
		t.opts.Log.Warn("could not remove the export journal", "dir", t.dir, "err", err)
	} else if err := syncDir(t.dir); err != nil {
		t.opts.Log.Warn("could not sync the model directory", "dir", t.dir, "err", err)
	}
	return nil
}

// prepare decides what happens to each file, writes whole files to temp files and opens
// the files to patch, so that everything that can fail for lack of space or permission
// fails before the journal commits.
func (t *txn) prepare(ctx context.Context, ex *existingModel, rep *Report) error {
	for i := range t.p.files {
		fp := &t.p.files[i]
		rep.Files = append(rep.Files, FileReport{Name: fp.name, Size: fp.size(), Mode: ModeNew})
	}
	for i := range t.p.files {
		fp, fr := &t.p.files[i], &rep.Files[i]
		if ex != nil {
			d, err := diffFile(ctx, filepath.Join(t.dir, fp.name), fp, t.src.Data, t.opts.BlockBytes, t.src.drop)
			if err != nil {
				return err
			}
			fr.Compared, fr.Changed = d.compared, d.changed
			rep.Compared += d.compared
			rep.Changed += d.changed
			switch {
			case d.changed == 0:
				fr.Mode = ModeUnchanged
				t.task.Add(uint64(fp.size()))
				continue
			case !d.rewrite:
				fr.Mode = ModeBlocks
				if _, err := t.a.open(fp.name, fp.size()); err != nil {
					return err
				}
				t.blocks = append(t.blocks, blockAction{fp: fp, diff: d, rep: fr})
				t.task.Add(uint64(fp.size()))
				continue
			}
			fr.Mode = ModeRewrite
		}
		before := t.c.written
		tmp, err := t.writeTemp(ctx, fp.name, t.task, fp.header, t.src.Data[fp.begin:fp.end])
		if err != nil {
			return err
		}
		fr.Written = t.c.written - before
		t.renames = append(t.renames, [2]string{tmp, fp.name})
	}
	if t.p.index != nil && (ex == nil || !ex.indexUnchanged(t.p)) {
		tmp, err := t.writeTemp(ctx, IndexFile, nil, t.p.index)
		if err != nil {
			return err
		}
		t.renames = append(t.renames, [2]string{tmp, IndexFile})
	}
	ents, err := os.ReadDir(t.dir)
	if err != nil {
		return fmt.Errorf("read model directory: %w", err)
	}
	for _, e := range ents {
		if isModelFile(e.Name()) && !t.p.has(e.Name()) {
			t.stale = append(t.stale, e.Name())
			rep.Files = append(rep.Files, FileReport{Name: e.Name(), Mode: ModeRemoved})
		}
	}
	return nil
}

// writeTemp writes a whole file to a durable temp file and returns its name; task (when
// not nil) is told of the bytes as they are written.
func (t *txn) writeTemp(ctx context.Context, name string, task progress.Task, parts ...[]byte) (string, error) {
	f, err := os.CreateTemp(t.dir, tempPrefix+name+".*"+tempSuffix)
	if err != nil {
		return "", fmt.Errorf("create temp file for %s: %w", filepath.Join(t.dir, name), err)
	}
	tmp := filepath.Base(f.Name())
	t.temps = append(t.temps, tmp)
	cf := &countedFile{File: f, c: t.c}
	const chunk = 8 << 20
	werr := func() error {
		for _, p := range parts {
			for len(p) > 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
				n := min(len(p), chunk)
				if _, err := cf.Write(p[:n]); err != nil {
					return err
				}
				if task != nil {
					task.Add(uint64(n))
				}
				t.src.drop(p[:n])
				p = p[n:]
			}
		}
		if err := f.Chmod(0o644); err != nil {
			return err
		}
		return f.Sync()
	}()
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return "", fmt.Errorf("write %s (as %s): %w", filepath.Join(t.dir, name), tmp, werr)
	}
	return tmp, nil
}

// writeJournal records every change and commits.
func (t *txn) writeJournal(ctx context.Context) error {
	j, err := createJournal(t.dir, t.c)
	if err != nil {
		return err
	}
	t.j = j
	buf := make([]byte, t.opts.BlockBytes)
	for _, b := range t.blocks {
		if err := ctx.Err(); err != nil {
			return err
		}
		size := b.fp.size()
		for _, off := range b.diff.blocks {
			n := int(min(int64(t.opts.BlockBytes), size-off))
			data := b.fp.at(t.src.Data, off, n, buf)
			if err := j.block(b.fp.name, size, off, data); err != nil {
				return err
			}
			t.src.drop(data)
		}
	}
	for _, r := range t.renames {
		if err := j.rename(r[0], r[1]); err != nil {
			return err
		}
	}
	for _, name := range t.stale {
		if err := j.remove(name); err != nil {
			return err
		}
	}
	if t.opts.faults.crash(crashBeforeCommit) {
		if err := j.flushUncommitted(); err != nil {
			return err
		}
		return errCrash
	}
	if err := j.commit(); err != nil {
		return err
	}
	t.commit = true
	return nil
}

// apply carries out the committed changes from memory (the journal holds the same bytes,
// for recovery) and makes them durable.
func (t *txn) apply() error {
	buf := make([]byte, t.opts.BlockBytes)
	total := 0
	for _, b := range t.blocks {
		total += len(b.diff.blocks)
	}
	done := 0
	for _, b := range t.blocks {
		size := b.fp.size()
		before := t.c.written
		for _, off := range b.diff.blocks {
			if t.opts.faults.crash(crashMidApply) && done >= total/2 {
				return errCrash
			}
			n := int(min(int64(t.opts.BlockBytes), size-off))
			data := b.fp.at(t.src.Data, off, n, buf)
			if err := t.a.block(b.fp.name, size, off, data); err != nil {
				return err
			}
			t.src.drop(data)
			done++
		}
		b.rep.Written = t.c.written - before
	}
	for _, r := range t.renames {
		if err := t.a.rename(r[0], r[1]); err != nil {
			return err
		}
	}
	for _, name := range t.stale {
		if err := t.a.remove(name); err != nil {
			return err
		}
	}
	return t.a.finish()
}

// cleanup undoes what a failed transaction left before its commit: temp files and the
// uncommitted journal. After the commit (or a simulated crash) it leaves everything for
// recovery.
func (t *txn) cleanup(err error) {
	t.a.close()
	if err == nil || errors.Is(err, errCrash) || t.commit {
		return
	}
	if t.j != nil {
		t.j.abort()
	}
	for _, tmp := range t.temps {
		os.Remove(filepath.Join(t.dir, tmp))
	}
}
