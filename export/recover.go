package export

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
)

// Recovery says what was found of an interrupted export.
type Recovery string

// The outcomes of recovery.
const (
	RecoveryNone      Recovery = ""          // no journal: the last export finished
	RecoveryReapplied Recovery = "reapplied" // a committed journal was applied (again) and removed
	RecoveryDiscarded Recovery = "discarded" // a journal without a valid commit was removed; files untouched
)

// Recover finishes or rolls back an export of dir that was interrupted: a committed journal
// is applied again, an uncommitted one discarded, and leftover temp files removed. Every
// export and VerifyDir does this first; call it directly to repair a directory by itself.
func Recover(dir string, log *slog.Logger) (Recovery, error) {
	if log == nil {
		log = slog.Default()
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return RecoveryNone, err
	}
	defer unlock()
	return recoverLocked(dir, newCounter(nil), log)
}

func recoverLocked(dir string, c *ioCounter, log *slog.Logger) (Recovery, error) {
	path := filepath.Join(dir, JournalFile)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return RecoveryNone, removeTemps(dir)
	}
	if err != nil {
		return RecoveryNone, fmt.Errorf("recover %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return RecoveryNone, fmt.Errorf("recover %s: %w", path, err)
	}
	outcome := RecoveryDiscarded
	if cerr := decodeJournal(f, st.Size(), nil); cerr != nil {
		// Apply starts only after the commit record is durable, so nothing was touched.
		log.Warn("discarding an export journal that was never committed", "journal", path, "reason", cerr)
	} else {
		if _, err := f.Seek(0, 0); err != nil {
			return RecoveryNone, fmt.Errorf("recover %s: %w", path, err)
		}
		a := newApplier(dir, c)
		if err := decodeJournal(f, st.Size(), a.op); err != nil {
			a.close()
			return RecoveryNone, fmt.Errorf("recover %s: apply: %w (the journal is kept; fix the cause and run again)", path, err)
		}
		if err := a.finish(); err != nil {
			return RecoveryNone, fmt.Errorf("recover %s: %w (the journal is kept)", path, err)
		}
		outcome = RecoveryReapplied
		log.Info("finished an interrupted export from its journal", "journal", path)
	}
	if err := os.Remove(path); err != nil {
		return RecoveryNone, fmt.Errorf("recover %s: remove journal: %w", path, err)
	}
	if err := removeTemps(dir); err != nil {
		return RecoveryNone, err
	}
	if err := syncDir(dir); err != nil {
		return RecoveryNone, fmt.Errorf("recover %s: %w", path, err)
	}
	return outcome, nil
}

// removeTemps deletes temp files of writes that never committed. Called under the lock,
// after any journal was applied, so no transaction still needs them.
func removeTemps(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read model directory %s: %w", dir, err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() && isTempFile(e.Name()) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("remove leftover %s: %w", filepath.Join(dir, e.Name()), err)
			}
		}
	}
	return nil
}
