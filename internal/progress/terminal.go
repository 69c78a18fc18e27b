package progress

import (
	"io"
	"strings"
	"sync"
	"time"
)

// Terminal defaults.
const (
	// ShowAfter: work that ends sooner is never shown (a round's fetch on a fast link).
	ShowAfter = time.Second
	// Redraw bounds how often the status line is written.
	Redraw = 200 * time.Millisecond
)

// clearLine moves to the start of the line and erases it.
const clearLine = "\r\x1b[K"

// Terminal shows the tasks under way on one status line at the bottom of a terminal,
// redrawn as they go; a task that was shown leaves its Summary line when it finishes.
// Other output to the same terminal goes through Wrap, which lifts the status line out
// of the way and puts it back.
type Terminal struct {
	mu       sync.Mutex
	w        io.Writer
	now      func() time.Time
	tasks    []*termTask
	drawn    bool // a status line is on the screen
	lastDraw time.Time
}

// NewTerminal is a Terminal writing its status line to w.
func NewTerminal(w io.Writer) *Terminal { return newTerminal(w, time.Now) }

func newTerminal(w io.Writer, now func() time.Time) *Terminal {
	return &Terminal{w: w, now: now}
}

type termTask struct {
	t     *Terminal
	name  string
	unit  string
	m     *Meter
	shown bool
	ended bool
}

// Start implements Tracker.
func (t *Terminal) Start(name, unit string, total, done uint64) Task {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := &termTask{t: t, name: name, unit: unit, m: NewMeter(total, done, t.now())}
	t.tasks = append(t.tasks, k)
	return k
}

func (k *termTask) Set(done uint64) {
	k.t.mu.Lock()
	defer k.t.mu.Unlock()
	k.set(done)
}

func (k *termTask) Add(n uint64) {
	k.t.mu.Lock()
	defer k.t.mu.Unlock()
	k.set(k.m.Done() + n)
}

func (k *termTask) set(done uint64) {
	t := k.t
	if k.ended {
		return
	}
	now := t.now()
	k.m.Observe(now, done)
	if now.Sub(t.lastDraw) >= Redraw {
		t.draw(now)
	}
}

func (k *termTask) Finish(err error) {
	t := k.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if k.ended {
		return
	}
	k.ended = true
	now := t.now()
	k.m.Observe(now, k.m.Done())
	for i, o := range t.tasks {
		if o == k {
			t.tasks = append(t.tasks[:i], t.tasks[i+1:]...)
			break
		}
	}
	if !k.shown {
		return
	}
	t.clear()
	io.WriteString(t.w, Summary(k.name, k.unit, k.m, err)+"\n")
	t.draw(now)
}

// clear erases the status line.
func (t *Terminal) clear() {
	if t.drawn {
		io.WriteString(t.w, clearLine)
		t.drawn = false
	}
}

// draw writes the status line: the tasks that have run for ShowAfter.
func (t *Terminal) draw(now time.Time) {
	var parts []string
	for _, k := range t.tasks {
		if now.Sub(k.m.start) >= ShowAfter {
			k.shown = true
			parts = append(parts, Line(k.name, k.unit, k.m))
		}
	}
	t.lastDraw = now
	if len(parts) == 0 {
		t.clear()
		return
	}
	io.WriteString(t.w, clearLine+strings.Join(parts, "  ·  "))
	t.drawn = true
}

// Wrap returns a writer to w (the same terminal) that erases the status line before
// each write and draws it again after.
func (t *Terminal) Wrap(w io.Writer) io.Writer { return wrapped{t, w} }

type wrapped struct {
	t *Terminal
	w io.Writer
}

func (x wrapped) Write(p []byte) (int, error) {
	x.t.mu.Lock()
	defer x.t.mu.Unlock()
	redraw := x.t.drawn
	x.t.clear()
	n, err := x.w.Write(p)
	if redraw {
		x.t.draw(x.t.now())
	}
	return n, err
}
