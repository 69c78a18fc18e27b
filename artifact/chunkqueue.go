package artifact

import "sync"

// Chunk states in a download.
const (
	chunkNeeded   uint8 = iota // nobody is fetching it
	chunkAssigned              // requested from a peer, or received and being verified
	chunkHave                  // verified and written
)

// chunkQueue hands out the chunks a download still needs. Holders pull work when their
// window has room, so a fast holder ends up serving more chunks than a slow one, and a
// chunk given back (bad data, lost peer) is handed out again before fresh ones.
// Every chunk is in exactly one place at a time: needed here, in one session's
// in-flight list, in the verify queue, or written.
type chunkQueue struct {
	mu        sync.Mutex
	state     []uint8
	retry     []int         // given back, handed out first (LIFO)
	next      int           // scan position for fresh chunks
	remaining int           // not yet written
	needed    int           // not assigned to anyone
	sessions  int           // sessions pulling work, for the fair share
	wake      chan struct{} // closed when chunks are given back or the download completes
	complete  chan struct{}
}

func newChunkQueue(n int, have func(int) bool) *chunkQueue {
	q := &chunkQueue{state: make([]uint8, n), wake: make(chan struct{}), complete: make(chan struct{})}
	for i := range q.state {
		if have(i) {
			q.state[i] = chunkHave
		} else {
			q.remaining++
		}
	}
	q.needed = q.remaining
	if q.remaining == 0 {
		close(q.complete)
	}
	return q
}

// addSessions registers (or, negative, unregisters) sessions that pull work.
func (q *chunkQueue) addSessions(n int) {
	q.mu.Lock()
	q.sessions += n
	q.mu.Unlock()
}

// take assigns up to n needed chunks, skipping those skip reports true for (chunks a
// partial holder lacks). No session gets more than its fair share of what is left, so
// the first holder to connect does not claim a small artifact's every chunk while the
// others are still opening streams. With nothing to hand out it returns a channel that
// is closed when that may have changed.
func (q *chunkQueue) take(dst []int, n int, skip func(int) bool) ([]int, <-chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	dst = dst[:0]
	if s := max(q.sessions, 1); n > 1 {
		n = min(n, max(1, (q.needed+s-1)/s))
	}
	defer func() { q.needed -= len(dst) }()
	for k := len(q.retry) - 1; k >= 0 && len(dst) < n; k-- {
		i := q.retry[k]
		if skip != nil && skip(i) {
			continue
		}
		q.retry = append(q.retry[:k], q.retry[k+1:]...)
		if q.state[i] == chunkNeeded {
			q.state[i] = chunkAssigned
			dst = append(dst, i)
		}
	}
	for ; q.next < len(q.state) && len(dst) < n; q.next++ {
		i := q.next
		if q.state[i] != chunkNeeded {
			continue
		}
		if skip != nil && skip(i) {
			// Left for other holders: put it where take looks first.
			q.retry = append(q.retry, i)
			continue
		}
		q.state[i] = chunkAssigned
		dst = append(dst, i)
	}
	if len(dst) == 0 {
		return dst, q.wake
	}
	return dst, nil
}

// giveBack returns assigned chunks to the pool.
func (q *chunkQueue) giveBack(idx ...int) {
	if len(idx) == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, i := range idx {
		if q.state[i] == chunkAssigned {
			q.state[i] = chunkNeeded
			q.needed++
			q.retry = append(q.retry, i)
		}
	}
	q.wakeLocked()
}

func (q *chunkQueue) wakeLocked() {
	close(q.wake)
	q.wake = make(chan struct{})
}

// done records chunk i as written.
func (q *chunkQueue) done(i int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state[i] == chunkHave {
		return
	}
	q.state[i] = chunkHave
	q.remaining--
	if q.remaining == 0 {
		close(q.complete)
		q.wakeLocked()
	}
}

func (q *chunkQueue) left() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.remaining
}
