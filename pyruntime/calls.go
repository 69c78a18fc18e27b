package pyruntime

import "time"

// callLog is the call bookkeeping both backends report in Status. Its owner guards it
// with its own mutex.
type callLog struct {
	calls       int64
	failures    int64
	lastCall    string
	lastCallAt  time.Time
	lastCallDur time.Duration
	lastErr     error
	lastErrAt   time.Time
}

// recordCall records a call that started at start; a non-nil err counts as a failure.
func (l *callLog) recordCall(name string, start time.Time, err error) {
	l.calls++
	l.lastCall, l.lastCallAt, l.lastCallDur = name, start, time.Since(start)
	if err != nil {
		l.failures++
		l.fail(err)
	}
}

// fail records an error that is not a call's (a failed start or restart).
func (l *callLog) fail(err error) { l.lastErr, l.lastErrAt = err, time.Now() }

// fill copies the bookkeeping into s.
func (l *callLog) fill(s *Status) {
	s.Calls, s.Failures = l.calls, l.failures
	s.LastCall, s.LastCallAt, s.LastCallDuration, s.LastErrorAt = l.lastCall, l.lastCallAt, l.lastCallDur, l.lastErrAt
	if l.lastErr != nil {
		s.LastError = l.lastErr.Error()
	}
}
