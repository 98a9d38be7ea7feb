package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// LifecycleEvent is an event from GET /v1/events (see the API's LifecycleEvent schema: fields appear when they apply).
type LifecycleEvent struct {
	ID       uint64    `json:"id,omitempty"`
	Type     string    `json:"type"`
	Time     time.Time `json:"time"`
	Sandbox  string    `json:"sandbox,omitempty"`
	Family   string    `json:"family,omitempty"`
	Status   string    `json:"status,omitempty"`
	Parent   string    `json:"parent,omitempty"`
	Children []string  `json:"children,omitempty"`
	Winner   string    `json:"winner,omitempty"`
	Other    string    `json:"other,omitempty"`
	N        int       `json:"n,omitempty"`
	Ms       float64   `json:"ms,omitempty"`
	PauseMs  float64   `json:"pause_ms,omitempty"`
	Bytes    int64     `json:"bytes,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	Error    string    `json:"error,omitempty"`
	After    uint64    `json:"after,omitempty"`
	Oldest   uint64    `json:"oldest,omitempty"`
}

// EventsOptions filters and positions Events.
type EventsOptions struct {
	Sandbox, Family string // only events concerning this sandbox, or of this fork family
	// After is the id of the last event already seen: the stream starts after it (from the server's history; a
	// "missed" event says when that no longer reaches back far enough). 0: from the next event.
	After uint64
	// Reconnect, when true, makes Events reconnect (resuming after the last event it delivered) when the stream
	// ends or breaks, until ctx ends; false returns at the first end.
	Reconnect bool
}

// Events follows the server's lifecycle events, calling f for each in order, until ctx ends (nil error... then
// ctx's), f returns an error (returned), or the stream ends without Reconnect.
func (c *Client) Events(ctx context.Context, o EventsOptions, f func(LifecycleEvent) error) error {
	last := o.After
	for {
		err := c.followOnce(ctx, o, &last, f)
		var stop stopErr
		switch {
		case errors.As(err, &stop):
			return stop.err
		case ctx.Err() != nil:
			return ctx.Err()
		case !o.Reconnect:
			return err
		}
		var apiErr *APIError
		if errors.As(err, &apiErr) && apiErr.StatusCode < 500 {
			return err // a bad filter or key does not get better by retrying
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// stopErr carries the callback's error out of the stream.
type stopErr struct{ err error }

func (e stopErr) Error() string { return e.err.Error() }

func (c *Client) followOnce(ctx context.Context, o EventsOptions, last *uint64, f func(LifecycleEvent) error) error {
	q := url.Values{}
	if o.Sandbox != "" {
		q.Set("sandbox", o.Sandbox)
	}
	if o.Family != "" {
		q.Set("family", o.Family)
	}
	if *last != 0 {
		q.Set("last_event_id", strconv.FormatUint(*last, 10))
	}
	resp, err := c.send(ctx, request{method: "GET", path: "/v1/events", query: q, accept: "text/event-stream"})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		if line != "" {
			if v, ok := strings.CutPrefix(line, "data:"); ok {
				data.WriteString(strings.TrimPrefix(v, " "))
			}
			continue // id and event lines repeat what data holds; comments are keepalives
		}
		if data.Len() == 0 {
			continue
		}
		var e LifecycleEvent
		if err := json.Unmarshal([]byte(data.String()), &e); err != nil {
			return fmt.Errorf("events: decode %q: %w", data.String(), err)
		}
		data.Reset()
		if e.ID != 0 {
			*last = e.ID
		}
		if err := f(e); err != nil {
			return stopErr{err}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("events: %w", err)
	}
	return errors.New("events: the server ended the stream")
}

// LogLine is one line of a sandbox's log (GET /v1/sandboxes/{id}/logs).
type LogLine struct {
	Time   time.Time `json:"time"`
	Source string    `json:"source"` // "agent" or "family"
	Text   string    `json:"text"`
}

// Logs returns a sandbox's recent log lines, oldest first.
func (c *Client) Logs(ctx context.Context, id string) ([]LogLine, error) {
	var out struct {
		Lines []LogLine `json:"lines"`
	}
	if _, err := c.do(ctx, request{method: "GET", path: sandboxPath(id, "/logs")}, &out); err != nil {
		return nil, err
	}
	return out.Lines, nil
}
