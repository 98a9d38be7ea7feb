package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// TestWaitWakesWithoutTime: in a synctest bubble time stands still until every goroutine is blocked, so a Wait
// that polls never sees the change until time is advanced; a notified Wait returns as soon as the sandbox
// changes (here it is deleted), with no time passing at all.
func TestWaitWakesWithoutTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		id := e.create()
		got := make(chan error, 1)
		go func() {
			_, err := e.svc.Wait(context.Background(), id, StatusPaused, time.Hour)
			got <- err
		}()
		synctest.Wait() // Wait is parked
		start := time.Now()
		if err := e.svc.Delete(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case err := <-got:
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("Wait = %v, want not found", err)
			}
		default:
			t.Fatal("Wait did not notice the deletion without time passing: it polls")
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("fake time advanced by %s", d)
		}
		e.svc.Close()
	})
}

// TestWaitEndsOnAFailedPause: a wait for paused ends as soon as the pause it waits for fails (the sandbox is
// running again, pause.error says why), whether the failure comes while it waits or came before it asked; a
// new pause clears the old failure, so a wait for it is not ended by the last one.
func TestWaitEndsOnAFailedPause(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create()
	var fail atomic.Bool
	fail.Store(true)
	hold := make(chan struct{}, 2)
	e.rt.SetFault(func(ctx context.Context, method, sid string) error {
		if method == "agent:snapshot_repl" {
			select {
			case <-hold:
			case <-ctx.Done():
			}
			if fail.Load() {
				return errors.New("the interpreter is gone")
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
	hold <- struct{}{}
	within(t, 20*time.Second, "Wait for paused after the pause failed", func() {
		if in := <-got; in.Status != StatusRunning || in.Pause == nil || in.Pause.Error == "" {
			t.Errorf("Wait = status %s, pause %+v; want running with the pause's error", in.Status, in.Pause)
		}
	})
	within(t, 5*time.Second, "Wait for paused asked after the pause failed", func() {
		if in, err := e.svc.Wait(context.Background(), id, StatusPaused, time.Hour); err != nil || in.Status != StatusRunning {
			t.Errorf("Wait = %s, %v", in.Status, err)
		}
	})
	// A new pause clears the failure: a wait for it waits until it is done, and sees it succeed.
	fail.Store(false)
	in, _, err := e.svc.Pause(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if in.Pause != nil && in.Pause.Error != "" {
		t.Fatalf("a new pause still shows the last one's error: %q", in.Pause.Error)
	}
	go func() {
		in, _ := e.svc.Wait(context.Background(), id, StatusPaused, time.Hour)
		got <- in
	}()
	waitBlocked(t, "(*Service).Wait", "select")
	select {
	case in := <-got:
		t.Fatalf("the wait for the second pause ended before it finished, with status %s", in.Status)
	case <-time.After(100 * time.Millisecond):
	}
	hold <- struct{}{}
	within(t, 20*time.Second, "Wait for the second pause", func() {
		if in := <-got; in.Status != StatusPaused {
			t.Errorf("Wait = %s, want paused", in.Status)
		}
	})
}

// TestDeleteStopsAStuckPause: a pause whose session save never ends (a snapshot store or an interpreter that
// stopped answering) does not hold a delete of the sandbox: the delete stops it, it rolls back, and the sandbox
// is deleted at once.
func TestDeleteStopsAStuckPause(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create()
	stuck := make(chan struct{}, 1)
	e.rt.SetFault(func(ctx context.Context, method, sid string) error {
		if method == "agent:snapshot_repl" {
			stuck <- struct{}{}
			<-ctx.Done() // stuck until the pause is stopped
			return ctx.Err()
		}
		return nil
	})
	if _, _, err := e.svc.Pause(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	<-stuck
	within(t, 20*time.Second, "Delete of a sandbox whose pause is stuck", func() {
		if err := e.svc.Delete(context.Background(), id); err != nil {
			t.Errorf("delete: %v", err)
		}
	})
	if _, err := e.svc.Get(context.Background(), id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get after the delete: %v", err)
	}
}

// TestDeleteStopsAFilesCall: a files call holds its sandbox for as long as its transfer runs, which a client
// decides; a delete runs what the call arranged with OnStop (the API ends the transfer's I/O), waits for the call
// to release, and the call's error then says the sandbox was deleted. A call released first runs nothing.
func TestDeleteStopsAFilesCall(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create()
	done, err := e.svc.Files(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	done.OnStop(func() { t.Errorf("OnStop ran for a call released before any delete") })
	done.Release()

	fc, err := e.svc.Files(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	fc.OnStop(func() { close(stopped) })
	go func() { // the transfer: ends when stopped, then releases
		<-stopped
		if err := fc.Err(errors.New("read: i/o timeout")); !errors.Is(err, errdefs.ErrConflict) ||
			!strings.Contains(err.Error(), "was deleted while the call ran") {
			t.Errorf("the stopped call's error: %v", err)
		}
		fc.Release()
	}()
	within(t, 20*time.Second, "Delete of a sandbox with a files call in flight", func() {
		if err := e.svc.Delete(context.Background(), id); err != nil {
			t.Errorf("delete: %v", err)
		}
	})
}

// TestStalledSessionFailsThePause: an interpreter that sends nothing of its session (code in the sandbox holding
// the GIL) fails the pause after Config.InterpreterStall instead of leaving the sandbox pausing for ever; the sandbox is
// running again, its pause error says why, and it answers.
func TestStalledSessionFailsThePause(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.InterpreterStall = 300 * time.Millisecond })
	id := e.create()
	e.run(id, "x = 1")
	stuck := make(chan struct{})
	e.rt.SetFault(func(ctx context.Context, method, sid string) error {
		if method == "agent:snapshot_repl" {
			close(stuck)
			<-ctx.Done() // sends nothing until the pause gives up
			return ctx.Err()
		}
		return nil
	})
	if _, _, err := e.svc.Pause(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	<-stuck
	in := e.waitFor(id, StatusRunning)
	if in.Pause == nil || !strings.Contains(in.Pause.Error, "sent nothing of its session") {
		t.Fatalf("pause info after a stalled session: %+v", in.Pause)
	}
	e.rt.SetFault(nil)
	if got := e.run(id, "x"); got != "1" {
		t.Fatalf("x after the failed pause = %q", got)
	}
}

// TestDeleteStopsAStuckCapture: a template's capture whose interpreter does not answer holds its sandbox until
// the stall bound; a delete of the sandbox stops it at once (the capture answers that the sandbox was deleted),
// and no template is left.
func TestDeleteStopsAStuckCapture(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.InterpreterStall = time.Hour })
	id := e.create()
	stuck := make(chan struct{})
	e.rt.SetFault(func(ctx context.Context, method, sid string) error {
		if method == "agent:snapshot_repl" {
			close(stuck)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	saved := make(chan error, 1)
	go func() {
		_, err := e.svc.SaveTemplate(context.Background(), "stuck", id)
		saved <- err
	}()
	<-stuck
	within(t, 20*time.Second, "Delete of a sandbox whose template capture is stuck", func() {
		if err := e.svc.Delete(context.Background(), id); err != nil {
			t.Errorf("delete: %v", err)
		}
	})
	if err := <-saved; !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "was deleted while the call ran") {
		t.Errorf("the capture stopped by the delete: %v", err)
	}
	if _, err := e.svc.GetTemplate(context.Background(), "stuck"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a template after the stopped capture: %v", err)
	}
}
