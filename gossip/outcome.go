package gossip

import (
	"errors"
	"fmt"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
)

// Sentinels for callers of Publish: a message our own validator would reject or ignore is
// not sent.
var (
	ErrRejected = errors.New("message rejected")
	ErrIgnored  = errors.New("message ignored")
)

// Reasons label metrics and logs; they are few and stable so dashboards can rely on them.
const (
	reasonOK              = "ok"
	reasonTooLarge        = "too_large"
	reasonMalformed       = "malformed"
	reasonWrongExperiment = "wrong_experiment"
	reasonNotValidator    = "not_validator"
	reasonAuthorMismatch  = "author_mismatch"
	reasonBadSignature    = "bad_signature"
	reasonNoAuthorSig     = "no_author_signature"
	reasonPanic           = "panic"
	reasonStale           = "stale"
	reasonDuplicate       = "duplicate"
)

// outcome is why a message was not accepted: Reject for forged or malformed messages (the
// sender is penalised by peer scoring), Ignore for stale ones (not the sender's fault).
type outcome struct {
	result pubsub.ValidationResult
	reason string
	err    error
}

func reject(reason string, err error) *outcome {
	return &outcome{result: pubsub.ValidationReject, reason: reason, err: err}
}

func rejectf(reason, format string, args ...any) *outcome {
	return reject(reason, fmt.Errorf(format, args...))
}

func ignoref(reason, format string, args ...any) *outcome {
	return &outcome{result: pubsub.ValidationIgnore, reason: reason, err: fmt.Errorf(format, args...)}
}

func (o *outcome) Error() string { return o.reason + ": " + o.err.Error() }

// Unwrap lets callers test for ErrRejected/ErrIgnored and for the cause (e.g. ErrMalformed).
func (o *outcome) Unwrap() []error {
	if o.result == pubsub.ValidationIgnore {
		return []error{ErrIgnored, o.err}
	}
	return []error{ErrRejected, o.err}
}

func resultName(r pubsub.ValidationResult) string {
	switch r {
	case pubsub.ValidationAccept:
		return "accept"
	case pubsub.ValidationReject:
		return "reject"
	case pubsub.ValidationIgnore:
		return "ignore"
	}
	return "unknown"
}
