package progress

import (
	"log/slog"
	"sync"
	"time"
)

// LogEvery is how often Log writes a task's progress.
const LogEvery = 10 * time.Second

// Log writes the progress of tasks that run for LogEvery or more as log records, one
// every LogEvery while they go and one when they end, for logs that machines read.
type Log struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time
}

// NewLog is a Log on log.
func NewLog(log *slog.Logger) *Log { return &Log{log: log, every: LogEvery, now: time.Now} }

type logTask struct {
	l      *Log
	mu     sync.Mutex
	name   string
	unit   string
	m      *Meter
	logged time.Time // when the last record went out; zero: none yet
	ended  bool
}

// Start implements Tracker.
func (l *Log) Start(name, unit string, total, done uint64) Task {
	return &logTask{l: l, name: name, unit: unit, m: NewMeter(total, done, l.now())}
}

func (k *logTask) Set(done uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.set(done)
}

func (k *logTask) Add(n uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.set(k.m.Done() + n)
}

func (k *logTask) set(done uint64) {
	if k.ended {
		return
	}
	now := k.l.now()
	k.m.Observe(now, done)
	last := k.logged
	if last.IsZero() {
		last = k.m.start
	}
	if now.Sub(last) < k.l.every {
		return
	}
	k.logged = now
	attrs := []any{"task", k.name, "done", k.m.Done()}
	if k.m.Total() > 0 {
		attrs = append(attrs, "total", k.m.Total(), "percent", percent(k.m.Done(), k.m.Total()))
	}
	if k.unit != InBytes {
		attrs = append(attrs, "unit", k.unit)
	}
	attrs = append(attrs, "per_second", int64(k.m.Rate()+0.5))
	if left, ok := k.m.Left(); ok {
		attrs = append(attrs, "left_seconds", int64(left.Seconds()+0.5))
	}
	k.l.log.Info("progress", attrs...)
}

func (k *logTask) Finish(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ended {
		return
	}
	k.ended = true
	k.m.Observe(k.l.now(), k.m.Done())
	if k.logged.IsZero() {
		return
	}
	if err != nil {
		k.l.log.Info("progress stopped", "task", k.name, "done", k.m.Done(), "err", err)
		return
	}
	k.l.log.Info("progress done", "task", k.name, "done", k.m.Done(), "seconds", int64(k.m.Elapsed().Seconds()+0.5))
}
