package sandbox

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// TestSetTimeoutKeepsAlive: in a synctest bubble (fake time), a sandbox created with a 10 s timeout and kept
// alive at 8 s for 10 s more outlives its first deadline and is destroyed at its new one; the new deadline is
// what expires_at says, and it survives a restart of the service.
func TestSetTimeoutKeepsAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, nil)
		in, err := e.svc.Create(ctx, CreateRequest{TimeoutS: 10})
		if err != nil {
			t.Fatal(err)
		}
		id := in.ID
		time.Sleep(8 * time.Second)
		got, err := e.svc.SetTimeout(ctx, id, 10)
		if err != nil {
			t.Fatal(err)
		}
		want := time.Now().Add(10 * time.Second)
		if got.TimeoutS != 10 || got.ExpiresAt == nil || !got.ExpiresAt.Equal(want) {
			t.Fatalf("after SetTimeout(10): timeout_s %d, expires_at %v; want 10, %v", got.TimeoutS, got.ExpiresAt, want)
		}
		time.Sleep(5 * time.Second) // 13 s after creation: past the first deadline
		synctest.Wait()
		if st := e.status(id); st != StatusRunning {
			t.Fatalf("status %s at 13 s, want running (kept alive)", st)
		}
		// A restart keeps the new deadline (stored), not created_at + timeout_s.
		e.svc.Close()
		e.start()
		if in, err := e.svc.Get(ctx, id); err != nil || !in.ExpiresAt.Equal(want) {
			t.Fatalf("after restart: %v, expires_at %v; want %v", err, in.ExpiresAt, want)
		}
		time.Sleep(6 * time.Second) // past the new deadline
		synctest.Wait()
		if _, err := e.svc.Get(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("Get after the new deadline = %v, want not found (destroyed)", err)
		}
		e.svc.Close()
	})
}

// TestSetTimeoutZeroAndBadInput: 0 removes the timeout; out-of-range values are 400 and change nothing; an
// unknown sandbox is 404.
func TestSetTimeoutZeroAndBadInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, nil)
		in, err := e.svc.Create(ctx, CreateRequest{TimeoutS: 5})
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []int{-1, MaxTimeoutS + 1} {
			if _, err := e.svc.SetTimeout(ctx, in.ID, bad); !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("SetTimeout(%d) = %v, want invalid", bad, err)
			}
		}
		if _, err := e.svc.SetTimeout(ctx, "sbx_nosuch", 5); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("SetTimeout(unknown) = %v, want not found", err)
		}
		got, err := e.svc.SetTimeout(ctx, in.ID, 0)
		if err != nil || got.TimeoutS != 0 || got.ExpiresAt != nil {
			t.Fatalf("SetTimeout(0) = %+v, %v; want no timeout", got, err)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if st := e.status(in.ID); st != StatusRunning {
			t.Fatalf("status %s an hour later, want running (no timeout)", st)
		}
		e.svc.Close()
	})
}

// TestSetTimeoutPausedAndError: a paused sandbox can be kept alive (its timer is re-armed with the new
// deadline); a sandbox in error cannot (409).
func TestSetTimeoutPausedAndError(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	in, err := e.svc.Create(ctx, CreateRequest{TimeoutS: 3600, OnTimeout: "pause"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.svc.Pause(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	e.waitFor(in.ID, StatusPaused)
	got, err := e.svc.SetTimeout(ctx, in.ID, 7200)
	if err != nil || got.Status != StatusPaused || got.TimeoutS != 7200 {
		t.Fatalf("SetTimeout on a paused sandbox = %+v, %v", got, err)
	}
	e.svc.mu.Lock()
	ent := e.svc.items[in.ID]
	e.svc.setStatus(ent, StatusResuming) //nolint:errcheck // paused -> resuming is in the table
	e.svc.setStatus(ent, StatusError)    //nolint:errcheck // resuming -> error too
	e.svc.mu.Unlock()
	if _, err := e.svc.SetTimeout(ctx, in.ID, 60); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("SetTimeout on a sandbox in error = %v, want conflict", err)
	}
}
