package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"
)

// Fork makes n children of a sandbox (1 <= n <= 32), each starting from the parent's state at the moment of
// the call: its interpreter's variables and its file system. The parent keeps running. It returns the
// children's ids.
func (c *Client) Fork(ctx context.Context, id string, n int) ([]string, error) {
	var out struct {
		Children []json.RawMessage `json:"children"`
	}
	body := struct {
		N int `json:"n"`
	}{n}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/fork"), json: body}, &out); err != nil {
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

// WaitStatus polls a sandbox until its status is want and returns it. It waits as long as the server's
// X-Poll-After header says between polls (growing from 100 ms to 2 s when there is none). If the sandbox goes
// to status "error" (and want is not "error") it returns the sandbox and a *StatusError. Bound the wait with
// ctx.
func (c *Client) WaitStatus(ctx context.Context, id, want string) (*Sandbox, error) {
	backoff := 100 * time.Millisecond
	for {
		sb, h, err := c.get(ctx, id)
		if err != nil {
			return nil, err
		}
		if sb.Status == want {
			return sb, nil
		}
		if sb.Status == StatusFailed {
			return sb, &StatusError{Sandbox: sb}
		}
		wait := pollAfter(h)
		if wait <= 0 {
			wait = backoff
			backoff = min(backoff*3/2, 2*time.Second)
		}
		wait = max(wait, 10*time.Millisecond)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return sb, fmt.Errorf("waiting for sandbox %s to be %s (status %s): %w", id, want, sb.Status, ctx.Err())
		case <-t.C:
		}
	}
}

// DefaultDiffPaths are the directories Diff compares when given none.
var DefaultDiffPaths = []string{"/root", "/tmp"}

// diffScript prints "sha256  path" for every regular file under its arguments (that exist), on one file system.
const diffScript = `for p in "$@"; do [ -e "$p" ] || continue; find "$p" -xdev -type f -exec sha256sum -- {} + ; done`

// Diff compares the regular files under paths (default DefaultDiffPaths) of sandboxes a and b, typically two
// forks of one parent: Added are files only in b, Removed files only in a, Modified files whose content
// differs. Like the hosted products' SDKs it runs sha256sum in both sandboxes (in parallel, through exec) and
// compares the lists here, so both sandboxes must be running.
func (c *Client) Diff(ctx context.Context, a, b string, paths []string) (*Diff, error) {
	if len(paths) == 0 {
		paths = DefaultDiffPaths
	}
	for _, p := range paths {
		if !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("diff: path %q must be absolute: %w", p, ErrInvalid)
		}
	}
	var (
		wg   sync.WaitGroup
		sums [2]map[string]string
		errs [2]error
	)
	for i, id := range []string{a, b} {
		wg.Go(func() { sums[i], errs[i] = c.fileSums(ctx, id, paths) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return diffSums(sums[0], sums[1]), nil
}

// fileSums returns path → sha256 of the regular files under paths in sandbox id.
func (c *Client) fileSums(ctx context.Context, id string, paths []string) (map[string]string, error) {
	argv := append([]string{"/bin/sh", "-c", diffScript, "sh"}, paths...)
	res, err := c.Exec(ctx, id, ExecRequest{Argv: argv, Cwd: "/"})
	if err != nil {
		return nil, fmt.Errorf("diff: sandbox %s: %w", id, err)
	}
	if res.TimedOut {
		return nil, fmt.Errorf("diff: sandbox %s: listing files timed out", id)
	}
	if res.ExitCode != 0 && res.Stdout == "" {
		return nil, fmt.Errorf("diff: sandbox %s: listing files failed (exit %d): %s", id, res.ExitCode, strings.TrimSpace(res.Stderr))
	}
	return parseSums(res.Stdout), nil
}

// parseSums parses sha256sum output. A line whose name holds a backslash, newline or carriage return starts
// with a backslash and has those escaped.
func parseSums(out string) map[string]string {
	m := map[string]string{}
	for line := range strings.SplitSeq(out, "\n") {
		escaped := strings.HasPrefix(line, `\`)
		if escaped {
			line = line[1:]
		}
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			// "sum *name" is binary mode.
			sum, name, ok = strings.Cut(line, " *")
		}
		if !ok || len(sum) != 64 {
			continue
		}
		if escaped {
			name = unescapeSumName(name)
		}
		m[name] = sum
	}
	return m
}

func unescapeSumName(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			switch s[i+1] {
			case '\\':
				b.WriteByte('\\')
				i++
				continue
			case 'n':
				b.WriteByte('\n')
				i++
				continue
			case 'r':
				b.WriteByte('\r')
				i++
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// diffSums compares two path → hash maps.
func diffSums(a, b map[string]string) *Diff {
	d := &Diff{Added: []string{}, Removed: []string{}, Modified: []string{}}
	for p, sa := range a {
		sb, ok := b[p]
		switch {
		case !ok:
			d.Removed = append(d.Removed, p)
		case sa != sb:
			d.Modified = append(d.Modified, p)
		}
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			d.Added = append(d.Added, p)
		}
	}
	sort.Strings(d.Added)
	sort.Strings(d.Removed)
	sort.Strings(d.Modified)
	return d
}
