package progress

import "sync"

// Recorder is a Tracker that keeps what it is told, for tests of the code that reports
// progress.
type Recorder struct {
	mu    sync.Mutex
	tasks []*recorded
}

// Recorded is a task as a Recorder saw it.
type Recorded struct {
	Name, Unit         string
	Total, Start, Done uint64
	Finished           bool
	Err                error
}

type recorded struct {
	r *Recorder
	Recorded
}

// Start implements Tracker.
func (r *Recorder) Start(name, unit string, total, done uint64) Task {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := &recorded{r: r, Recorded: Recorded{Name: name, Unit: unit, Total: total, Start: done, Done: done}}
	r.tasks = append(r.tasks, k)
	return k
}

// Tasks are the tasks started so far, as they stand.
func (r *Recorder) Tasks() []Recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Recorded, len(r.tasks))
	for i, k := range r.tasks {
		out[i] = k.Recorded
	}
	return out
}

func (k *recorded) Set(done uint64) { k.r.mu.Lock(); k.Done = done; k.r.mu.Unlock() }
func (k *recorded) Add(n uint64)    { k.r.mu.Lock(); k.Done += n; k.r.mu.Unlock() }
func (k *recorded) Finish(err error) {
	k.r.mu.Lock()
	k.Finished, k.Err = true, err
	k.r.mu.Unlock()
}
