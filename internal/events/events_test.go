package events

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

func ids(evs []Event) []uint64 {
	var out []uint64
	for _, e := range evs {
		out = append(out, e.ID)
	}
	return out
}

func TestSinceResumesAfterAnID(t *testing.T) {
	h := New(8)
	first := h.Publish(Event{Type: Created, Sandbox: "a"})
	h.Publish(Event{Type: Created, Sandbox: "b"})
	third := h.Publish(Event{Type: Destroyed, Sandbox: "a"})
	evs, _ := h.Since(first.ID)
	if got := ids(evs); len(got) != 2 || got[0] != first.ID+1 || got[1] != third.ID {
		t.Fatalf("since %d: %v", first.ID, got)
	}
	if evs, _ := h.Since(third.ID); len(evs) != 0 {
		t.Fatalf("up to date: %v", evs)
	}
	if evs, _ := h.Since(0); len(evs) != 0 {
		t.Fatalf("id 0 means from now on: %v", evs)
	}
}

func TestSinceSaysWhatFellOutOfTheHistory(t *testing.T) {
	h := New(3)
	first := h.Publish(Event{Type: Created, Sandbox: "a"})
	for i := 0; i < 4; i++ {
		h.Publish(Event{Type: Created, Sandbox: "b"})
	}
	evs, _ := h.Since(first.ID) // first.ID+1 was overwritten: events are missing
	if len(evs) != 4 || evs[0].Type != Missed || evs[0].After != first.ID || evs[0].Oldest != first.ID+2 {
		t.Fatalf("got %+v", evs)
	}
	if got := ids(evs[1:]); got[0] != first.ID+2 || got[2] != first.ID+4 {
		t.Fatalf("history after the missed event: %v", got)
	}
	// An id this hub never gave (a server restart: the new hub's ids are higher than the old one's).
	evs, _ = h.Since(first.ID + 100)
	if len(evs) != 4 || evs[0].Type != Missed {
		t.Fatalf("unknown id: %+v", evs)
	}
	// Still inside the history: no missed event.
	if evs, _ := h.Since(first.ID + 1); len(evs) != 3 || evs[0].Type == Missed {
		t.Fatalf("oldest-1: %+v", evs)
	}
}

func TestLaterHubsGiveHigherIDs(t *testing.T) {
	a := New(4).Publish(Event{Type: Created})
	b := New(4).Publish(Event{Type: Created})
	if b.ID < a.ID {
		t.Fatalf("second hub's first id %d is below the first's %d", b.ID, a.ID)
	}
}

func TestFilter(t *testing.T) {
	fork := Event{Type: Forked, Sandbox: "p", Family: "f1", Children: []string{"c1", "c2"}}
	cases := []struct {
		f    Filter
		e    Event
		want bool
	}{
		{Filter{}, fork, true},
		{Filter{Sandbox: "c2"}, fork, true},
		{Filter{Sandbox: "p"}, fork, true},
		{Filter{Sandbox: "x"}, fork, false},
		{Filter{Family: "f1"}, fork, true},
		{Filter{Family: "f2"}, fork, false},
		{Filter{Sandbox: "w"}, Event{Type: Merged, Sandbox: "p", Winner: "w"}, true},
		{Filter{Sandbox: "b"}, Event{Type: Diffed, Sandbox: "a", Other: "b"}, true},
		{Filter{Sandbox: "x", Family: "y"}, Event{Type: Missed}, true},
	}
	for i, c := range cases {
		if got := c.f.Match(c.e); got != c.want {
			t.Errorf("case %d: %+v matching %+v = %v", i, c.f, c.e, got)
		}
	}
}

// Follow delivers the history, then what is published while it waits, filtered, in order.
func TestFollowDeliversHistoryThenLiveEvents(t *testing.T) {
	h := New(16)
	before := h.Publish(Event{Type: Created, Sandbox: "a", Family: "fa"})
	h.Publish(Event{Type: Created, Sandbox: "b", Family: "fb"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan Event, 10)
	done := make(chan error, 1)
	go func() {
		done <- h.Follow(ctx, before.ID-1, Filter{Family: "fa"}, func(e Event) error { got <- e; return nil }, nil)
	}()
	if e := <-got; e.ID != before.ID {
		t.Fatalf("first: %+v", e)
	}
	// Published after Follow has delivered the history: Follow is waiting or about to; either way it sees it.
	live := h.Publish(Event{Type: Destroyed, Sandbox: "a", Family: "fa"})
	h.Publish(Event{Type: Destroyed, Sandbox: "b", Family: "fb"})
	if e := <-got; e.ID != live.ID || e.Type != Destroyed {
		t.Fatalf("live: %+v", e)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("follow ended with %v", err)
	}
	if len(got) != 0 {
		t.Fatalf("an event of another family passed: %+v", <-got)
	}
}

func TestFollowStopsWhenSendFails(t *testing.T) {
	h := New(4)
	e := h.Publish(Event{Type: Created})
	h.Publish(Event{Type: Created})
	boom := errors.New("client gone")
	err := h.Follow(context.Background(), e.ID-1, Filter{}, func(Event) error { return boom }, nil)
	if !errors.Is(err, boom) {
		t.Fatalf("got %v", err)
	}
}

func TestWatchSeesEveryEventWithItsID(t *testing.T) {
	h := New(2)
	var seen []uint64
	h.Watch(func(e Event) { seen = append(seen, e.ID) })
	a := h.Publish(Event{Type: Created})
	b := h.Publish(Event{Type: Created})
	if len(seen) != 2 || seen[0] != a.ID || seen[1] != b.ID {
		t.Fatalf("seen %v", seen)
	}
}

func TestNilHubDiscards(t *testing.T) {
	var h *Hub
	h.Publish(Event{Type: Created}) // must not panic
}

func TestWriteSSE(t *testing.T) {
	var b bytes.Buffer
	if err := WriteSSE(&b, Event{ID: 7, Type: Forked, Sandbox: "p", Children: []string{"c"}}); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&b)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) != 4 || lines[0] != "id: 7" || lines[1] != "event: forked" ||
		!strings.HasPrefix(lines[2], `data: {"id":7,"type":"forked"`) || lines[3] != "" {
		t.Fatalf("got %q", lines)
	}
	b.Reset()
	WriteSSE(&b, Event{Type: Missed, After: 3, Oldest: 9}) //nolint:errcheck
	if strings.Contains(b.String(), "id:") {
		t.Fatalf("a missed event has no id: %q", b.String())
	}
}
