package sandbox

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/events"
)

// The service publishes one event per lifecycle step, in order, with what a follower needs to redraw a fork
// tree: the fork's parent and children, the merge's winner, the pause's size.
func TestLifecycleEvents(t *testing.T) {
	hub := events.New(0)
	e := newEnv(t, func(c *Config) { c.Events = hub })
	ctx := context.Background()
	from := hub.Last()
	a := e.create()
	fr, err := e.svc.Fork(ctx, a, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Diff(ctx, a, fr.Children[0], nil); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.MergeInto(ctx, a, fr.Children[0]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.svc.Pause(ctx, a); err != nil {
		t.Fatal(err)
	}
	e.waitFor(a, StatusPaused)
	if _, _, err := e.svc.Resume(ctx, a); err != nil {
		t.Fatal(err)
	}
	e.waitFor(a, StatusRunning)
	if err := e.svc.Delete(ctx, fr.Children[1]); err != nil {
		t.Fatal(err)
	}

	evs, _ := hub.Since(from)
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	want := []string{events.Created, events.Forked, events.Diffed, events.Merged, events.Pausing, events.Paused,
		events.Resuming, events.Resumed, events.Destroyed}
	if !slices.Equal(types, want) {
		t.Fatalf("events %v, want %v", types, want)
	}
	fam := evs[0].Family
	for i, ev := range evs {
		if ev.ID != from+uint64(i)+1 || ev.Time.IsZero() || ev.Family != fam && ev.Type != events.Resumed {
			t.Errorf("event %d: %+v (family %s)", i, ev, fam)
		}
	}
	if f := evs[1]; f.Sandbox != a || !slices.Equal(f.Children, fr.Children) || f.N != 2 || f.Status != "running" {
		t.Errorf("forked: %+v", f)
	}
	if d := evs[2]; d.Sandbox != a || d.Other != fr.Children[0] {
		t.Errorf("diffed: %+v", d)
	}
	if m := evs[3]; m.Sandbox != a || m.Winner != fr.Children[0] {
		t.Errorf("merged: %+v", m)
	}
	if p := evs[5]; p.Sandbox != a || p.Bytes <= 0 || p.Status != "paused" {
		t.Errorf("paused: %+v", p)
	}
	if r := evs[7]; r.Sandbox != a || r.Bytes != evs[5].Bytes || r.Status != "running" {
		t.Errorf("resumed: %+v", r)
	}
	if d := evs[8]; d.Sandbox != fr.Children[1] || d.Reason != "deleted" {
		t.Errorf("destroyed: %+v", d)
	}
}

// A failed resume publishes an event that says why: resume_failed, the sandbox paused again (a snapshot that
// is itself broken is an error event: TestBrokenSnapshotResumeIsError).
func TestErrorEventSaysWhy(t *testing.T) {
	hub := events.New(0)
	e := newEnv(t, func(c *Config) { c.Events = hub })
	ctx := context.Background()
	a := e.create()
	if _, _, err := e.svc.Pause(ctx, a); err != nil {
		t.Fatal(err)
	}
	e.waitFor(a, StatusPaused)
	from := hub.Last()
	e.snaps.SetFault(func(_ context.Context, method, _ string) error { // the snapshot cannot be read
		if method == "Get" {
			return errors.New("store unreachable")
		}
		return nil
	})
	if _, _, err := e.svc.Resume(ctx, a); err != nil {
		t.Fatal(err)
	}
	if in, _ := e.svc.Wait(ctx, a, StatusRunning, 20*time.Second); in.Status != StatusPaused {
		t.Fatalf("after the failed resume %s is %s, want paused", a, in.Status)
	}
	evs, _ := hub.Since(from)
	if len(evs) != 2 || evs[1].Type != events.ResumeFailed || evs[1].Sandbox != a || evs[1].Error == "" || evs[1].Status != "paused" {
		t.Fatalf("events %+v", evs)
	}
}

func TestStatsAndUsages(t *testing.T) {
	e := newEnv(t, nil)
	a, b := e.create(), e.create()
	st := e.svc.Stats()
	if st.Sandboxes[StatusRunning] != 2 {
		t.Fatalf("stats %+v", st)
	}
	us := e.svc.Usages(1)
	if len(us) != 1 || us[0].ID != b { // the newest first, capped
		t.Fatalf("usages(1) = %+v (a %s, b %s)", us, a, b)
	}
	if len(e.svc.Usages(0)) != 0 {
		t.Fatal("usages(0) is off")
	}
}
