package progress

import "context"

// InBytes is the unit of tasks that count bytes; other tasks name what they count
// ("heads", "files").
const InBytes = ""

// Tracker shows tasks' progress: a terminal's status line (Terminal), periodic log
// records (Log).
type Tracker interface {
	// Start begins a task of total units (0: not known), done of them already done.
	Start(name, unit string, total, done uint64) Task
}

// Task is one piece of long work being shown.
type Task interface {
	// Set says done units are done; Add that n more are.
	Set(done uint64)
	Add(n uint64)
	// Finish ends the task; err says why it stopped short (nil: it completed).
	Finish(err error)
}

// Start begins a task on t, or one that shows nothing when t is nil.
func Start(t Tracker, name, unit string, total, done uint64) Task {
	if t == nil {
		return nop{}
	}
	return t.Start(name, unit, total, done)
}

type nop struct{}

func (nop) Set(uint64)   {}
func (nop) Add(uint64)   {}
func (nop) Finish(error) {}

type nameKey struct{}

// WithName names the work done under ctx ("fetching round 12's parameters"), for the
// code that does it, which knows what it moves but not what it is for.
func WithName(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, nameKey{}, name)
}

// Name is the name WithName gave ctx, or fallback.
func Name(ctx context.Context, fallback string) string {
	if n, ok := ctx.Value(nameKey{}).(string); ok && n != "" {
		return n
	}
	return fallback
}
