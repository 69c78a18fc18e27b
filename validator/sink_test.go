package validator

import (
	"fmt"
	"sync"
	"time"

	"github.com/p2pnode/p2pnode/chain"
)

// testSink keeps what a validator under test reports: its status and its events.
type testSink struct {
	mu     sync.Mutex
	status Status
	events []string
}

func (s *testSink) Status(fn func(*Status)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(&s.status)
}

func (s *testSink) Event(kind, format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, kind+": "+fmt.Sprintf(format, args...))
}

func (s *testSink) Rejected(string)                              {}
func (s *testSink) LeaseEnded(string)                            {}
func (s *testSink) MetricDropped(string)                         {}
func (s *testSink) RoundClosed(time.Duration, int, *chain.Notes) {}

func (s *testSink) snapshot() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}
