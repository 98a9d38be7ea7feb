package sandbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/store"
)

// TestCloseCancelsPause: Close cancels a pause in progress (held in its session save, or in its freeze, until
// cancelled) instead of waiting for it forever; the pause rolls back: the sandbox is recorded running, thawed,
// and no snapshot object is left.
func TestCloseCancelsPause(t *testing.T) {
	for _, at := range []string{"agent:snapshot_repl", "Freeze"} {
		t.Run(at, func(t *testing.T) {
			e := newEnv(t, nil)
			id := e.create()
			held := make(chan struct{})
			e.rt.SetFault(func(ctx context.Context, method, sid string) error {
				if method == at {
					close(held)
					<-ctx.Done() // until Close cancels (or the server hangs up)
					return ctx.Err()
				}
				return nil
			})
			if _, _, err := e.svc.Pause(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			<-held
			within(t, 20*time.Second, "Close", e.svc.Close)
			rec, err := e.store.Get(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if Status(rec.Status) != StatusRunning {
				t.Fatalf("after Close the record says %s, want running", rec.Status)
			}
			if e.rt.Frozen(id) {
				t.Fatal("the sandbox was left frozen")
			}
			if left := e.snaps.Keys(); len(left) != 0 {
				t.Fatalf("the cancelled pause left snapshot objects: %v", left)
			}
		})
	}
}

// TestCloseCancelsResume: Close cancels a resume held in its session restore; the half-resumed sandbox is
// destroyed, the record says paused, as before the resume, and the snapshot is kept so that the resume can be
// retried.
func TestCloseCancelsResume(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create()
	e.run(id, "x = 1")
	if _, _, err := e.svc.Pause(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	e.waitFor(id, StatusPaused)
	snapshot := e.snaps.Keys()
	held := make(chan struct{})
	e.rt.SetFault(func(ctx context.Context, method, sid string) error {
		if method == "agent:restore_repl" {
			close(held)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	if _, _, err := e.svc.Resume(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	<-held
	within(t, 20*time.Second, "Close", e.svc.Close)
	rec, err := e.store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if Status(rec.Status) != StatusPaused || rec.Snapshot == "" {
		t.Fatalf("after Close the record says %s with snapshot %q, want paused with the snapshot", rec.Status, rec.Snapshot)
	}
	if left := e.rt.IDs(); len(left) != 0 {
		t.Fatalf("the half-resumed sandbox is left: %v", left)
	}
	if got := e.snaps.Keys(); len(got) != len(snapshot) {
		t.Fatalf("snapshot objects %v, want %v", got, snapshot)
	}
	e.rt.SetFault(nil)
	e.start()
	if _, _, err := e.svc.Resume(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	e.waitFor(id, StatusRunning)
	if got := e.run(id, "x"); got != "1" {
		t.Fatalf("x = %q after the retried resume", got)
	}
}

// TestCloseIsBounded: background work that ignores cancellation (a runtime call stuck in the kernel) holds
// Close for at most Config.CloseTimeout.
func TestCloseIsBounded(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.CloseTimeout = 50 * time.Millisecond })
	id := e.create()
	stuck, unstick := make(chan struct{}), make(chan struct{})
	defer close(unstick)
	e.rt.SetFault(func(ctx context.Context, method, sid string) error {
		if method == "Freeze" {
			close(stuck)
			<-unstick
		}
		return nil
	})
	if _, _, err := e.svc.Pause(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	<-stuck
	within(t, 20*time.Second, "Close", e.svc.Close)
}

// TestCloseRefusesNewWork: once Close has begun, a pause is refused rather than started unwaited-for.
func TestCloseRefusesNewWork(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create()
	e.svc.Close()
	if _, _, err := e.svc.Pause(context.Background(), id); err == nil {
		t.Fatal("a pause started after Close")
	}
	if st := e.status(id); st != StatusRunning {
		t.Fatalf("status %s after a refused pause", st)
	}
}

// TestCloseRacesTimeouts: timeouts firing while the service closes (restarted with every sandbox overdue) must
// neither race Close's wait (the race detector checks) nor act after Close has returned.
func TestCloseRacesTimeouts(t *testing.T) {
	e := newEnv(t, nil)
	var ids []string
	for i := 0; i < 20; i++ {
		in, err := e.svc.Create(context.Background(), CreateRequest{TimeoutS: 1})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, in.ID)
	}
	e.svc.Close()
	// Every sandbox overdue, so that each restart fires all their timers at once (the records are put back
	// before each restart: the timeouts delete them).
	var recs []store.Record
	for _, id := range ids {
		rec, err := e.store.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		rec.CreatedAt = rec.CreatedAt.Add(-time.Hour)
		recs = append(recs, rec)
	}
	var mu sync.Mutex
	closed := false
	e.rt.SetFault(func(ctx context.Context, method, id string) error {
		mu.Lock()
		defer mu.Unlock()
		if closed && method == "Destroy" {
			t.Errorf("a timeout destroyed %s after Close returned", id)
		}
		return nil
	})
	for i := 0; i < 20; i++ {
		mu.Lock()
		closed = false
		mu.Unlock()
		if err := e.store.PutMany(context.Background(), recs, nil); err != nil {
			t.Fatal(err)
		}
		e.start()
		e.svc.Close()
		mu.Lock()
		closed = true // until the next start: no timeout of the closed service may act now
		mu.Unlock()
	}
}

// TestWaitIsNotified: Wait returns on the status change itself, and on deletion, with no polling interval in
// between (its timeout here is far longer than the test).
func TestWaitIsNotified(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create()
	gate := e.rt.Gate("snapshot")
	e.rt.SetFault(func(ctx context.Context, method, sid string) error {
		if method == "agent:snapshot_repl" {
			select {
			case <-e.rt.GateChan("snapshot"):
			case <-ctx.Done():
			}
		}
		return nil
	})
	if _, _, err := e.svc.Pause(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	got := make(chan Info, 1)
	go func() {
		in, _ := e.svc.Wait(context.Background(), id, StatusPaused, time.Hour)
		got <- in
	}()
	waitBlocked(t, "(*Service).Wait", "select")
	gate()
	within(t, 20*time.Second, "Wait", func() {
		if in := <-got; in.Status != StatusPaused {
			t.Errorf("Wait returned %s", in.Status)
		}
	})
	errc := make(chan error, 1)
	go func() {
		_, err := e.svc.Wait(context.Background(), id, StatusRunning, time.Hour)
		errc <- err
	}()
	waitBlocked(t, "(*Service).Wait", "select")
	if err := e.svc.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	within(t, 20*time.Second, "Wait on a deleted sandbox", func() {
		if err := <-errc; err == nil {
			t.Error("Wait on a deleted sandbox returned no error")
		}
	})
}
