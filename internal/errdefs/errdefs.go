// Package errdefs owns ramify's small error taxonomy: the sentinel errors that every layer wraps with context
// and that the HTTP API maps to status codes in one place.
package errdefs

import "errors"

var (
	// ErrNotFound: the thing named does not exist (HTTP 404).
	ErrNotFound = errors.New("not found")
	// ErrInvalid: the request is malformed or a value is out of range (HTTP 400).
	ErrInvalid = errors.New("invalid argument")
	// ErrConflict: the thing is not in a state that allows the operation (HTTP 409).
	ErrConflict = errors.New("conflict")
	// ErrUnauthorized: missing or wrong credentials (HTTP 401).
	ErrUnauthorized = errors.New("unauthorized")
	// ErrTooLarge: a request body exceeds its limit (HTTP 413).
	ErrTooLarge = errors.New("too large")
	// ErrUnavailable: the server cannot serve the request now, e.g. it is out of capacity (HTTP 503).
	ErrUnavailable = errors.New("unavailable")
)

// userError carries a message meant for API users alongside a sentinel.
type userError struct {
	msg  string
	kind error
}

func (e *userError) Error() string { return e.msg }
func (e *userError) Unwrap() error { return e.kind }

// New returns an error whose text is msg exactly (safe to show to API users) and which matches kind with errors.Is.
func New(kind error, msg string) error { return &userError{msg: msg, kind: kind} }

// Message returns the text to show an API user: the outermost user message if the chain carries one,
// else the error's own text.
func Message(err error) string {
	var ue *userError
	if errors.As(err, &ue) {
		return ue.msg
	}
	return err.Error()
}
