package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Fork makes n children of a sandbox (1 <= n <= 32), each starting from the parent's state at the moment of
// the call: its interpreter's variables and its file system. The parent keeps running. It returns the
// children's ids.
func (c *Client) Fork(ctx context.Context, id string, n int) ([]string, error) {
	return c.ForkWith(ctx, id, ForkRequest{N: n})
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork: the number of children and what they get instead
// of the parent's (nil: inherited).
type ForkRequest struct {
	N int `json:"n"`
	// StartPaused, for a paused parent: leave the children paused.
	StartPaused bool `json:"start_paused,omitempty"`
	// Egress is the children's outbound allowlist (nil: the parent's; empty: no outbound traffic).
	Egress *[]string `json:"egress,omitempty"`
	// IngressEnabled is the children's ingress setting (nil: the parent's).
	IngressEnabled *bool `json:"ingress_enabled,omitempty"`
	// SSHPubkeys are authorized on the children on top of the parent's keys.
	SSHPubkeys []string `json:"ssh_pubkeys,omitempty"`
}

// ForkWith is Fork with the children's egress, ingress and (for a paused parent) start_paused.
func (c *Client) ForkWith(ctx context.Context, id string, req ForkRequest) ([]string, error) {
	var out struct {
		Children []json.RawMessage `json:"children"`
	}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/fork"), json: req}, &out); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(out.Children))
	for _, raw := range out.Children {
		// Children are ids; accept sandbox objects too.
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			ids = append(ids, s)
			continue
		}
		var sb Sandbox
		if err := json.Unmarshal(raw, &sb); err != nil || sb.ID == "" {
			return nil, fmt.Errorf("fork: unexpected child %s", raw)
		}
		ids = append(ids, sb.ID)
	}
	return ids, nil
}

// MergeInto commits winner's state into parent: afterwards parent's id drives what was winner (its interpreter
// and file system), and winner's id is retired (ErrNotFound). Siblings are not touched. Merging a sandbox into
// itself is ErrInvalid; a second merge of the same winner is ErrNotFound.
func (c *Client) MergeInto(ctx context.Context, parent, winner string) error {
	_, err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(parent, "/merge_into/"+url.PathEscape(winner))}, nil)
	return err
}

// Pause starts pausing a running sandbox (it stops using CPU; its state is kept). It returns the sandbox as
// the server answered (status "pausing", or "paused" if it already was) and the server's suggested wait
// before the first poll (X-Poll-After; 0 if none). Use WaitStatus(ctx, id, StatusPaused) to wait.
func (c *Client) Pause(ctx context.Context, id string) (*Sandbox, time.Duration, error) {
	return c.lifecycle(ctx, id, "/pause")
}

// Resume starts resuming a paused (or error) sandbox, like Pause. Use WaitStatus(ctx, id, StatusRunning).
func (c *Client) Resume(ctx context.Context, id string) (*Sandbox, time.Duration, error) {
	return c.lifecycle(ctx, id, "/resume")
}

func (c *Client) lifecycle(ctx context.Context, id, op string) (*Sandbox, time.Duration, error) {
	var sb Sandbox
	h, err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, op)}, &sb)
	if err != nil {
		return nil, 0, err
	}
	if sb.ID == "" {
		sb.ID = id
	}
	return &sb, pollAfter(h), nil
}

// PauseError is returned by WaitStatus, waiting for "paused", when the pause failed: the sandbox was not paused
// and keeps running; Sandbox.Pause.Error says why.
type PauseError struct {
	Sandbox *Sandbox
}

func (e *PauseError) Error() string {
	return fmt.Sprintf("sandbox %s was not paused and keeps running: %s", e.Sandbox.ID, e.Sandbox.Pause.Error)
}

// ResumeError is returned by WaitStatus, waiting for "running", when the resume failed for a reason that
// retrying may cure: the sandbox is paused again with its snapshot intact; Sandbox.Pause.Error says why. (A
// broken snapshot puts the sandbox in status "error": a *StatusError.)
type ResumeError struct {
	Sandbox *Sandbox
}

func (e *ResumeError) Error() string {
	return fmt.Sprintf("sandbox %s was not resumed and is paused again: %s", e.Sandbox.ID, e.Sandbox.Pause.Error)
}

// StatusError is returned by WaitStatus when the sandbox went to status "error".
type StatusError struct {
	Sandbox *Sandbox
}

func (e *StatusError) Error() string {
	reason := e.Sandbox.Error
	if reason == "" {
		reason = "no reason given"
	}
	return fmt.Sprintf("sandbox %s is in status error: %s", e.Sandbox.ID, reason)
}

// WaitStatus waits until the sandbox's status is want and returns it. It asks the server to answer when the
// status changes (GET /v1/sandboxes/{id}/wait, up to 20 s per request, again until ctx ends), so it returns
// within milliseconds of the transition. If the sandbox goes to status "error" (and want is not "error") it
// returns the sandbox and a *StatusError; waiting for "paused", if the pause failed (the sandbox keeps
// running), the sandbox and a *PauseError; waiting for "running", if the resume failed (the sandbox is paused
// again), the sandbox and a *ResumeError. Bound the wait with ctx.
func (c *Client) WaitStatus(ctx context.Context, id, want string) (*Sandbox, error) {
	for {
		timeout := waitChunk
		if dl, ok := ctx.Deadline(); ok {
			timeout = min(timeout, time.Until(dl))
		}
		q := url.Values{"status": {want}, "timeout_s": {strconv.FormatFloat(max(timeout, 0).Seconds(), 'f', 3, 64)}}
		var sb Sandbox
		if _, err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/wait"), query: q}, &sb); err != nil {
			return nil, err
		}
		if sb.Status == want {
			return &sb, nil
		}
		if sb.Status == StatusFailed {
			return &sb, &StatusError{Sandbox: &sb}
		}
		if want == StatusPaused && sb.Status == StatusRunning && sb.Pause != nil && sb.Pause.Error != "" {
			return &sb, &PauseError{Sandbox: &sb}
		}
		if want == StatusRunning && sb.Status == StatusPaused && sb.Pause != nil && sb.Pause.Error != "" {
			return &sb, &ResumeError{Sandbox: &sb}
		}
		if err := ctx.Err(); err != nil {
			return &sb, fmt.Errorf("waiting for sandbox %s to be %s (status %s): %w", id, want, sb.Status, err)
		}
	}
}

// waitChunk is how long one wait request may take.
const waitChunk = 20 * time.Second

// DefaultDiffPaths are the directories Diff compares when given none.
var DefaultDiffPaths = []string{"/root", "/tmp"}

// Diff compares the files under paths (default: the server's, /root and /tmp) of sandboxes a and b, typically
// two forks of one parent: Added are files only in b, Removed files only in a, Modified files whose content
// differs. The server computes it from the sandboxes' writable layers.
func (c *Client) Diff(ctx context.Context, a, b string, paths []string) (*Diff, error) {
	for _, p := range paths {
		if !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("diff: path %q must be absolute: %w", p, ErrInvalid)
		}
	}
	q := url.Values{}
	key := "paths"
	for _, p := range paths {
		if !utf8.ValidString(p) {
			key = "paths_b64" // all in base64: the server takes one form or the other
		}
	}
	for _, p := range paths {
		if key == "paths_b64" {
			p = base64.StdEncoding.EncodeToString([]byte(p))
		}
		q.Add(key, p)
	}
	var d Diff
	if _, err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(a, "/diff/"+url.PathEscape(b)), query: q}, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// PortURL is the API's URL of a port of an ingress-enabled sandbox: requests to it (and to paths under it) go to
// that port inside the sandbox, with the API key in Authorization or X-Api-Key (which is not forwarded).
func (c *Client) PortURL(id string, port int) string {
	return c.base + sandboxPath(id, "/ports/"+strconv.Itoa(port)+"/")
}
