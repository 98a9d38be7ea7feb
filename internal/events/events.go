// Package events owns ramify's lifecycle event stream: the Event type the sandbox service publishes (created,
// forked, merged, diffed, pausing, paused, pause_failed, resuming, resumed, resume_failed, destroyed, error), a
// bounded in-memory history that followers resume from by event id, and the filters of GET /v1/events. It knows
// nothing of HTTP beyond the server-sent events encoding of one event.
package events

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"
)

// The event types.
const (
	Created     = "created"      // a sandbox was created (status running)
	Forked      = "forked"       // sandbox forked into children (parent in sandbox, children, ms, pause_ms, n)
	Merged      = "merged"       // winner was merged into sandbox (winner retired)
	Diffed      = "diffed"       // sandbox was diffed against other
	Pausing     = "pausing"      // a pause began
	Paused      = "paused"       // the pause finished (bytes, ms)
	PauseFailed = "pause_failed" // the pause failed; the sandbox runs on (error)
	Resuming    = "resuming"     // a resume began
	Resumed     = "resumed"      // the resume finished (bytes, ms)
	// ResumeFailed: the resume failed and the sandbox is paused again, its snapshot intact (error); a resume
	// whose snapshot is broken is an Error event instead.
	ResumeFailed = "resume_failed"
	Destroyed    = "destroyed" // the sandbox is gone (reason)
	Error        = "error"     // the sandbox's status became error (error)
	Restarted    = "restarted" // ramify's processes for a running sandbox died and it was restarted: files kept, interpreter state lost (reason)
	// Missed is sent (without an id) to a follower whose Last-Event-ID is older than the history or unknown to
	// this server (e.g. from before a restart): events between it and the first event that follows were lost.
	Missed = "missed"
)

// Event is one lifecycle event.
type Event struct {
	ID      uint64    `json:"id,omitempty"`
	Type    string    `json:"type"`
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox,omitempty"`
	Family  string    `json:"family,omitempty"`
	// Status is the sandbox's status after the event ("" for destroyed, merged-away and missed).
	Status   string   `json:"status,omitempty"`
	Parent   string   `json:"parent,omitempty"`   // created by a fork: the parent
	Children []string `json:"children,omitempty"` // forked
	Winner   string   `json:"winner,omitempty"`   // merged: the id merged into sandbox, now retired
	Other    string   `json:"other,omitempty"`    // diffed: the sandbox compared against
	N        int      `json:"n,omitempty"`        // forked: how many children
	Ms       float64  `json:"ms,omitempty"`       // how long the operation took
	PauseMs  float64  `json:"pause_ms,omitempty"` // forked: how long the parent was frozen
	Bytes    int64    `json:"bytes,omitempty"`    // paused, resumed: the snapshot's size
	Reason   string   `json:"reason,omitempty"`   // destroyed, restarted: why
	Error    string   `json:"error,omitempty"`    // error, pause_failed, resume_failed: what went wrong
	// Missed: the Last-Event-ID the follower gave, and the oldest id still held.
	After  uint64 `json:"after,omitempty"`
	Oldest uint64 `json:"oldest,omitempty"`
}

// Mentions reports whether the event concerns sandbox id (as its subject, parent, child, winner or other side).
func (e Event) Mentions(id string) bool {
	return e.Sandbox == id || e.Parent == id || e.Winner == id || e.Other == id || slices.Contains(e.Children, id)
}

// Filter selects events; empty fields match everything. A missed event always passes.
type Filter struct {
	Sandbox string
	Family  string
}

// Match reports whether e passes f.
func (f Filter) Match(e Event) bool {
	if e.Type == Missed {
		return true
	}
	if f.Sandbox != "" && !e.Mentions(f.Sandbox) {
		return false
	}
	return f.Family == "" || e.Family == f.Family
}

// WriteSSE writes e in the server-sent events format: an id line (unless it has none), an event line with its
// type, and its JSON as data.
func WriteSSE(w io.Writer, e Event) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if e.ID != 0 {
		if _, err := fmt.Fprintf(w, "id: %d\n", e.ID); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", e.Type, b)
	return err
}

// DefaultHistory is how many events a Hub keeps for followers that resume.
const DefaultHistory = 4096

// Hub publishes events to followers and keeps the last events (a bounded history) so that a follower that
// reconnects with the id of the last event it saw gets what it missed. Publish never blocks: a follower reads
// the history at its own pace, and one that falls behind by more than the history gets a Missed event.
//
// Ids grow by one per event; a hub's first id is derived from the time it was made (Unix milliseconds × 1000),
// so the ids of one server run are above those of earlier runs and a Last-Event-ID from before a restart is
// recognised as unknown rather than silently taken for a recent one. A nil *Hub discards what is published.
type Hub struct {
	mu       sync.Mutex
	ring     []Event // the history, oldest first once full; len <= size
	start    int     // index of the oldest event in ring
	size     int
	next     uint64        // the id of the next event
	wake     chan struct{} // closed at the next publish
	now      func() time.Time
	watchers []func(Event)
}

// New returns a hub keeping the last size events (DefaultHistory when size <= 0).
func New(size int) *Hub {
	if size <= 0 {
		size = DefaultHistory
	}
	return &Hub{size: size, next: uint64(time.Now().UnixMilli()) * 1000, wake: make(chan struct{}), now: time.Now}
}

// Watch calls f synchronously for every event published from now on (in publishing order, with its id). f must
// be quick and must not publish; metrics use it.
func (h *Hub) Watch(f func(Event)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watchers = append(h.watchers, f)
}

// Publish assigns e an id and a time (unless set) and adds it to the history. It never blocks on followers.
func (h *Hub) Publish(e Event) Event {
	if h == nil {
		return e
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e.ID = h.next
	h.next++
	if e.Time.IsZero() {
		e.Time = h.now().UTC()
	}
	if len(h.ring) < h.size {
		h.ring = append(h.ring, e)
	} else {
		h.ring[h.start] = e
		h.start = (h.start + 1) % h.size
	}
	for _, f := range h.watchers {
		f(e)
	}
	close(h.wake)
	h.wake = make(chan struct{})
	return e
}

// Since returns the events after id (oldest first), a Missed event first when id is neither 0 nor an id the
// history still covers, and a channel closed at the next publish. id 0 means "from now on": no history.
func (h *Hub) Since(id uint64) ([]Event, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if id == 0 || len(h.ring) == 0 && id == h.next-1 {
		return nil, h.wake
	}
	var out []Event
	oldest := h.next - uint64(len(h.ring)) // the id of the oldest event held (h.next when none)
	if id+1 < oldest || id >= h.next {
		out = append(out, Event{Type: Missed, Time: h.now().UTC(), After: id, Oldest: oldest})
		id = oldest - 1
	}
	for i := id + 1 - oldest; i < uint64(len(h.ring)); i++ {
		out = append(out, h.ring[(h.start+int(i))%len(h.ring)])
	}
	return out, h.wake
}

// Last is the id of the last event published (the hub's first id minus one when none was).
func (h *Hub) Last() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.next - 1
}

// KeepaliveInterval is how often Follow calls ping while no event passes.
const KeepaliveInterval = 15 * time.Second

// Follow calls send for every event after id that passes f, in order, first from the history then as they are
// published, until ctx ends or send or ping fails. Pass id 0 to start with the next event published. ping, if
// set, is called every KeepaliveInterval (an SSE comment keeps proxies from closing an idle stream).
func (h *Hub) Follow(ctx context.Context, id uint64, f Filter, send func(Event) error, ping func() error) error {
	if id == 0 {
		id = h.Last()
	}
	tick := time.NewTicker(KeepaliveInterval)
	defer tick.Stop()
	for {
		evs, wake := h.Since(id)
		for _, e := range evs {
			if e.ID != 0 {
				id = e.ID
			} else if e.Type == Missed {
				id = e.Oldest - 1
			}
			if !f.Match(e) {
				continue
			}
			if err := send(e); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		case <-tick.C:
			if ping != nil {
				if err := ping(); err != nil {
					return err
				}
			}
		}
	}
}
