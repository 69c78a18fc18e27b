//go:build unix

package gossip

import (
	"syscall"
	"time"
)

// busyCPU is the CPU time this process has used (user + system), not wall time: other
// processes sharing the machine do not count.
func busyCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
