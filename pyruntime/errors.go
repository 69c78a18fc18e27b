package pyruntime

import (
	"errors"
	"fmt"
)

// Sentinel errors callers branch on.
var (
	// ErrTimeout: a call passed its deadline; the worker was killed and is restarting.
	ErrTimeout = errors.New("call timed out")
	// ErrWorkerExited: the worker (or command) exited during a call.
	ErrWorkerExited = errors.New("worker exited")
	// ErrProtocol: the worker broke the frame protocol; it was killed and is restarting.
	ErrProtocol = errors.New("protocol error")
	// ErrFailed: restarts kept failing and the runtime gave up.
	ErrFailed = errors.New("worker failed")
	// ErrClosed: the runtime was closed.
	ErrClosed = errors.New("runtime closed")
	// ErrNotStarted: a call before Start.
	ErrNotStarted = errors.New("runtime not started")
	// ErrStateLost: Export after a restart lost the parameters set by Load.
	ErrStateLost = errors.New("worker restarted since Load")
	// ErrUnsupported: the worker did not advertise the capability a method needs.
	ErrUnsupported = errors.New("not supported by this worker")
	// ErrCommandFailed: the checkpoint command exited non-zero or wrote no result.
	ErrCommandFailed = errors.New("checkpoint command failed")

	// The protocol's error types (docs/worker-protocol.md); *RemoteError matches them.
	ErrBadRequest     = errors.New("BadRequest")
	ErrWorkload       = errors.New("WorkloadError")
	ErrLayoutMismatch = errors.New("LayoutMismatch")
	ErrNonFinite      = errors.New("NonFinite")
	ErrInternal       = errors.New("Internal")
	// ErrRankFailed: a rank of a multi-device worker exited or stopped answering; the
	// call failed and the worker restarted its ranks.
	ErrRankFailed = errors.New("RankFailed")
)

// RemoteError is an error raised in Python and reported in a response frame (or in a
// checkpoint command's result manifest).
type RemoteError struct {
	Type      string `json:"type"`
	Message   string `json:"message"`
	Traceback string `json:"traceback"`
}

func (e *RemoteError) Error() string { return fmt.Sprintf("%s: %s", e.Type, e.Message) }

// Is matches the sentinel of the error's type.
func (e *RemoteError) Is(target error) bool {
	switch target {
	case ErrBadRequest:
		return e.Type == "BadRequest"
	case ErrWorkload:
		return e.Type == "WorkloadError"
	case ErrLayoutMismatch:
		return e.Type == "LayoutMismatch"
	case ErrNonFinite:
		return e.Type == "NonFinite"
	case ErrInternal:
		return e.Type == "Internal"
	case ErrRankFailed:
		return e.Type == "RankFailed"
	}
	return false
}
