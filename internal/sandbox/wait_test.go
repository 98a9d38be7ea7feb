package sandbox

import (
	"context"
	"errors"
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
