package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// The sentinels an *APIError matches with errors.Is. They are the same values as the server's internal
// errdefs, re-exported because code outside this module cannot import an internal package.
var (
	// ErrNotFound: 404, an unknown sandbox or a missing file.
	ErrNotFound = errdefs.ErrNotFound
	// ErrInvalid: 400 (and 413, 422), a malformed request or a value out of range.
	ErrInvalid = errdefs.ErrInvalid
	// ErrConflict: 409, the sandbox is not in a state that allows the call.
	ErrConflict = errdefs.ErrConflict
	// ErrUnauthorized: 401 (and 403), a missing or wrong API key.
	ErrUnauthorized = errdefs.ErrUnauthorized
	// ErrTooLarge: 413, a request body over the server's limit. A 413 also matches ErrInvalid.
	ErrTooLarge = errdefs.ErrTooLarge
)

// APIError is an error status returned by the server.
type APIError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Message is the server's {"error": "..."} text, or the start of a non-JSON body, or the status text.
	Message string
}

// Error returns "<message> (HTTP <status>)".
func (e *APIError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.StatusCode) }

// Unwrap returns the sentinels the status maps to, so that errors.Is(err, ErrNotFound) works.
func (e *APIError) Unwrap() []error {
	switch e.StatusCode {
	case http.StatusNotFound:
		return []error{errdefs.ErrNotFound}
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return []error{errdefs.ErrInvalid}
	case http.StatusRequestEntityTooLarge:
		return []error{errdefs.ErrInvalid, errdefs.ErrTooLarge}
	case http.StatusConflict:
		return []error{errdefs.ErrConflict}
	case http.StatusUnauthorized, http.StatusForbidden:
		return []error{errdefs.ErrUnauthorized}
	}
	return nil
}

// readAPIError builds an *APIError from an error response.
func readAPIError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	msg := ""
	var body struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(b, &body) == nil && body.Error != "" {
		msg = body.Error
	} else if s := strings.TrimSpace(string(b)); s != "" {
		if len(s) > 512 {
			s = s[:512] + "..."
		}
		msg = s
	}
	if msg == "" {
		msg = strings.ToLower(http.StatusText(resp.StatusCode))
		if msg == "" {
			msg = "unexpected status"
		}
	}
	return &APIError{StatusCode: resp.StatusCode, Message: msg}
}

// IsStatus reports whether err is an *APIError with the given HTTP status.
func IsStatus(err error, status int) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.StatusCode == status
}
