package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
)

// leftovers fails the test if anything but the sandboxes in keep is known to the API, the store, the runtime or
// (by key prefix) the snapshot store.
func (e *env) leftovers(keep ...string) {
	e.t.Helper()
	ok := map[string]bool{}
	for _, id := range keep {
		ok[id] = true
	}
	for _, id := range e.ids() {
		if !ok[id] {
			e.t.Errorf("the API still lists %s", id)
		}
	}
	recs, err := e.store.List(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, r := range recs {
		if !ok[r.ID] {
			e.t.Errorf("the store still holds %s (%s)", r.ID, r.Status)
		}
	}
	for _, id := range e.rt.IDs() {
		if !ok[id] {
			e.t.Errorf("the runtime still holds %s", id)
		}
	}
	for _, k := range e.snaps.Keys() {
		id, _, _ := strings.Cut(k, "/")
		if !ok[id] {
			e.t.Errorf("the snapshot store still holds %s", k)
		}
	}
}

// TestForkOfPausedIsAllOrNothing: when copying the third child's snapshot fails, the first two children (their
// snapshot copies, records and addresses) are undone too.
func TestForkOfPausedIsAllOrNothing(t *testing.T) {
	for _, startPaused := range []bool{true, false} {
		e := newEnv(t, nil)
		ctx := context.Background()
		p := e.create()
		e.run(p, "x = 1")
		if _, _, err := e.svc.Pause(ctx, p); err != nil {
			t.Fatal(err)
		}
		e.waitFor(p, StatusPaused)
		var kids atomic.Int32
		injected := errors.New("injected: bucket full")
		e.snaps.SetFault(func(ctx context.Context, method, key string) error {
			if method == "Copy" && strings.HasSuffix(key, "/manifest.json") && kids.Add(1) == 3 {
				return injected
			}
			return nil
		})
		_, err := e.svc.ForkWith(ctx, p, 4, startPaused)
		if !errors.Is(err, injected) {
			t.Fatalf("fork = %v, want the injected failure", err)
		}
		e.snaps.SetFault(nil)
		e.leftovers(p)
		if st := e.status(p); st != StatusPaused {
			t.Fatalf("parent is %s", st)
		}
		// The parent is intact: it still forks and resumes.
		fr, err := e.svc.ForkWith(ctx, p, 2, startPaused)
		if err != nil || len(fr.Children) != 2 {
			t.Fatalf("fork after the failure: %v %v", fr, err)
		}
		if !startPaused {
			for _, c := range fr.Children {
				e.waitFor(c, StatusRunning)
				if got := e.run(c, "x"); got != "1" {
					t.Fatalf("child's x = %q", got)
				}
			}
		}
	}
}

// TestCreateRollsBackWhenCancelled: a client that goes away while its sandbox is being started leaves nothing
// behind, although the rollback then runs with a cancelled request context.
func TestCreateRollsBackWhenCancelled(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	e.rt.SetFault(func(_ context.Context, method, id string) error {
		if method == "Create" {
			cancel() // the runtime's create succeeds; saving the running record then fails
		}
		return nil
	})
	if _, err := e.svc.Create(ctx, CreateRequest{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("create = %v, want context.Canceled", err)
	}
	e.leftovers()
}

// TestForkRollsBack: a runtime fork that fails, or children whose records cannot be saved (the client went
// away), leave the parent as it was and no child behind.
func TestForkRollsBack(t *testing.T) {
	e := newEnv(t, nil)
	p := e.create()
	injected := errors.New("injected: no memory")
	e.rt.SetFault(func(_ context.Context, method, id string) error {
		if method == "Fork" {
			return injected
		}
		return nil
	})
	if _, err := e.svc.Fork(context.Background(), p, 3); !errors.Is(err, injected) {
		t.Fatalf("fork = %v", err)
	}
	e.leftovers(p)
	ctx, cancel := context.WithCancel(context.Background())
	e.rt.SetFault(func(_ context.Context, method, id string) error {
		if method == "Fork" {
			cancel()
		}
		return nil
	})
	if _, err := e.svc.Fork(ctx, p, 3); !errors.Is(err, context.Canceled) {
		t.Fatalf("fork = %v, want context.Canceled", err)
	}
	e.leftovers(p)
	e.rt.SetFault(nil)
	e.run(p, "y = 2")
}

// TestUndoStack: steps are undone newest first, every one even when some fail or the context has ended, and
// their errors come back joined.
func TestUndoStack(t *testing.T) {
	var u undoStack
	var order []string
	e1, e2 := errors.New("one"), errors.New("two")
	for _, name := range []string{"a", "b", "c"} {
		u.push(name, func(ctx context.Context) error {
			if ctx.Err() != nil {
				t.Errorf("step %s ran on an ended context", name)
			}
			order = append(order, name)
			switch name {
			case "a":
				return e1
			case "c":
				return e2
			}
			return nil
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := u.rollback(ctx)
	if strings.Join(order, "") != "cba" {
		t.Errorf("undone in order %v, want c b a", order)
	}
	if !errors.Is(err, e1) || !errors.Is(err, e2) {
		t.Errorf("rollback = %v, want both errors", err)
	}
	if err := u.rollback(ctx); err != nil || len(order) != 3 {
		t.Errorf("a second rollback undid again: %v %v", err, order)
	}
}
