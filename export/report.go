package export

import (
	"fmt"
	"io"
	"time"
)

// How a file was brought up to date.
const (
	ModeNew       = "new"       // written whole: there was no model, or not in place
	ModeRewrite   = "rewrite"   // written whole: more than half of it changed
	ModeBlocks    = "blocks"    // only changed blocks rewritten, through the journal
	ModeUnchanged = "unchanged" // identical already
	ModeRemoved   = "removed"   // a stale model file the new export does not have
)

// FileReport is what an export did to one file.
type FileReport struct {
	Name     string `json:"name"`
	Mode     string `json:"mode"`
	Size     int64  `json:"size"`
	Compared int64  `json:"compared"` // bytes compared with the file on disk (in place)
	Changed  int64  `json:"changed"`  // bytes of the blocks that differed
	Written  int64  `json:"written"`  // bytes written for this file (temp file or blocks)
}

// Report is what one export did.
type Report struct {
	Dir        string       `json:"dir"`
	Head       string       `json:"head,omitempty"`
	Round      uint64       `json:"round"`
	InPlace    bool         `json:"in_place"` // an existing model was diffed
	BlockBytes int          `json:"block_bytes,omitempty"`
	Files      []FileReport `json:"files"`
	Compared   int64        `json:"compared"`
	Changed    int64        `json:"changed"`
	// Written counts every byte written to disk, the journal included.
	Written      int64         `json:"written"`
	JournalBytes int64         `json:"journal_bytes"`
	Recovered    Recovery      `json:"recovered,omitempty"` // what was found of an interrupted export
	Duration     time.Duration `json:"duration_ns"`
}

// Print writes the report for people: one line per file and a total.
func (r *Report) Print(w io.Writer) {
	what := "full export"
	if r.InPlace {
		what = fmt.Sprintf("in-place sync (%s blocks)", HumanBytes(int64(r.BlockBytes)))
	}
	head := r.Head
	if head == "" {
		head = "(no head)"
	}
	fmt.Fprintf(w, "%s of head %s (round %d) to %s\n", what, head, r.Round, r.Dir)
	if r.Recovered != RecoveryNone {
		fmt.Fprintf(w, "  recovered an interrupted export first: journal %s\n", r.Recovered)
	}
	for _, f := range r.Files {
		fmt.Fprintf(w, "  %-36s %-9s %10s", f.Name, f.Mode, HumanBytes(f.Size))
		if r.InPlace && f.Mode != ModeRemoved {
			fmt.Fprintf(w, "  compared %10s  changed %10s (%s)", HumanBytes(f.Compared), HumanBytes(f.Changed), percent(f.Changed, f.Compared))
		}
		fmt.Fprintf(w, "  written %10s\n", HumanBytes(f.Written))
	}
	fmt.Fprintf(w, "  total: ")
	if r.InPlace {
		fmt.Fprintf(w, "compared %s, changed %s (%s), ", HumanBytes(r.Compared), HumanBytes(r.Changed), percent(r.Changed, r.Compared))
	}
	fmt.Fprintf(w, "written %s (journal %s) in %s\n", HumanBytes(r.Written), HumanBytes(r.JournalBytes), r.Duration.Round(time.Millisecond))
}

func percent(a, b int64) string {
	if b == 0 {
		return "0%"
	}
	return fmt.Sprintf("%.2f%%", 100*float64(a)/float64(b))
}

// HumanBytes formats n in binary units.
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
