package orpc

import (
	"context"
	"errors"
	"fmt"
)

// Code is a call's status code. The values are gRPC's, so they read the same in logs.
type Code uint32

// Status codes. OK is success; the others are failures.
const (
	OK                 Code = 0
	Canceled           Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	Unauthenticated    Code = 16
)

var codeNames = map[Code]string{
	OK: "OK", Canceled: "Canceled", Unknown: "Unknown", InvalidArgument: "InvalidArgument",
	DeadlineExceeded: "DeadlineExceeded", NotFound: "NotFound", AlreadyExists: "AlreadyExists",
	PermissionDenied: "PermissionDenied", ResourceExhausted: "ResourceExhausted",
	FailedPrecondition: "FailedPrecondition", Aborted: "Aborted", Unimplemented: "Unimplemented",
	Internal: "Internal", Unavailable: "Unavailable", Unauthenticated: "Unauthenticated",
}

func (c Code) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("Code(%d)", uint32(c))
}

// Status is the error type of a failed call: a code and a message. It travels in the END
// frame. errors.Is(err, ErrNotFound) matches any *Status with that code, and a Canceled or
// DeadlineExceeded status also matches context.Canceled or context.DeadlineExceeded.
type Status struct {
	Code    Code
	Message string
}

func (s *Status) Error() string {
	if s.Message == "" {
		return "orpc: " + s.Code.String()
	}
	return "orpc: " + s.Code.String() + ": " + s.Message
}

// Is reports whether target is a *Status of the same code (whose message is empty or equal),
// or the context error matching a Canceled or DeadlineExceeded status.
func (s *Status) Is(target error) bool {
	switch target {
	case context.Canceled:
		return s.Code == Canceled
	case context.DeadlineExceeded:
		return s.Code == DeadlineExceeded
	}
	t, ok := target.(*Status)
	return ok && t.Code == s.Code && (t.Message == "" || t.Message == s.Message)
}

// Sentinels for errors.Is.
var (
	ErrCanceled           = &Status{Code: Canceled}
	ErrUnknown            = &Status{Code: Unknown}
	ErrInvalidArgument    = &Status{Code: InvalidArgument}
	ErrDeadlineExceeded   = &Status{Code: DeadlineExceeded}
	ErrNotFound           = &Status{Code: NotFound}
	ErrAlreadyExists      = &Status{Code: AlreadyExists}
	ErrPermissionDenied   = &Status{Code: PermissionDenied}
	ErrResourceExhausted  = &Status{Code: ResourceExhausted}
	ErrFailedPrecondition = &Status{Code: FailedPrecondition}
	ErrAborted            = &Status{Code: Aborted}
	ErrUnimplemented      = &Status{Code: Unimplemented}
	ErrInternal           = &Status{Code: Internal}
	ErrUnavailable        = &Status{Code: Unavailable}
	ErrUnauthenticated    = &Status{Code: Unauthenticated}
)

// Errorf returns a *Status with the code and a formatted message.
func Errorf(c Code, format string, args ...any) error {
	return &Status{Code: c, Message: fmt.Sprintf(format, args...)}
}

// Error returns a *Status with the code and message.
func Error(c Code, msg string) error { return &Status{Code: c, Message: msg} }

// StatusOf converts any error into a *Status: nil is OK; a *Status anywhere in the chain is
// returned as is; context errors map to Canceled and DeadlineExceeded; anything else is
// Unknown with the error's text.
func StatusOf(err error) *Status {
	if err == nil {
		return &Status{Code: OK}
	}
	if s, ok := errors.AsType[*Status](err); ok {
		return s
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return &Status{Code: DeadlineExceeded, Message: err.Error()}
	case errors.Is(err, context.Canceled):
		return &Status{Code: Canceled, Message: err.Error()}
	}
	return &Status{Code: Unknown, Message: err.Error()}
}

// CodeOf returns StatusOf(err).Code.
func CodeOf(err error) Code { return StatusOf(err).Code }

// ctxStatus turns a done context into the status a call ends with.
func ctxStatus(ctx context.Context) *Status {
	err := context.Cause(ctx)
	if s, ok := errors.AsType[*Status](err); ok {
		return s
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &Status{Code: DeadlineExceeded, Message: "deadline exceeded"}
	}
	return &Status{Code: Canceled, Message: "call canceled"}
}
