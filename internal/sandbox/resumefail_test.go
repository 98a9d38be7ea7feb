package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/runtime"
	"github.com/ramify-dev/ramify/internal/store"
)

// pausedWith makes a sandbox with x = 41, pauses it and returns its id and its snapshot's objects.
func (e *env) pausedWith() (string, []string) {
	e.t.Helper()
	id := e.create()
	e.run(id, "x = 41")
	if _, _, err := e.svc.Pause(context.Background(), id); err != nil {
		e.t.Fatal(err)
	}
	e.waitFor(id, StatusPaused)
	return id, e.snaps.Keys()
}

// resumeOutcome starts a resume of id and waits, bounded, for the outcome a client sees: Wait for running
// answers on success and on failure alike.
func (e *env) resumeOutcome(id string) Info {
	e.t.Helper()
	if _, _, err := e.svc.Resume(context.Background(), id); err != nil {
		e.t.Fatalf("resume %s: %v", id, err)
	}
	var in Info
	within(e.t, 15*time.Second, "wait for the resume's outcome", func() {
		var err error
		in, err = e.svc.Wait(context.Background(), id, StatusRunning, 10*time.Second)
		if err != nil {
			e.t.Errorf("wait: %v", err)
		}
	})
	if in.Status == StatusResuming {
		e.t.Fatalf("the wait for running did not end on the resume's outcome: %+v", in)
	}
	return in
}

// TestFailedResumeStaysPaused: a resume that fails for a reason that is not its snapshot's (the store not
// answering, the host's disk full, a restore over the quota, the interpreter killed while loading) leaves the
// sandbox as it was: paused, its record saying so, its snapshot intact, nothing of it running; the failure is
// in pause.error and a resume_failed event, a wait for running ends on it, and a later resume brings the
// sandbox back with its state.
func TestFailedResumeStaysPaused(t *testing.T) {
	cases := []struct {
		name  string
		fault func(e *env)
	}{
		{"store unreachable", func(e *env) {
			e.snaps.SetFault(func(_ context.Context, method, _ string) error {
				if method == "Get" {
					return errors.New("dial tcp 10.0.0.1:9000: connect: connection refused")
				}
				return nil
			})
		}},
		{"host disk full", func(e *env) {
			e.rt.SetFault(func(_ context.Context, method, _ string) error {
				if method == "Create" {
					return fmt.Errorf("create layer: %w", unix.ENOSPC)
				}
				return nil
			})
		}},
		{"restore over the quota", func(e *env) {
			e.rt.SetFault(func(_ context.Context, method, _ string) error {
				if method == "Create" {
					return fmt.Errorf("populate layer: the snapshot's files do not fit in the sandbox's disk quota: %w", unix.EDQUOT)
				}
				return nil
			})
		}},
		{"interpreter killed while loading", func(e *env) {
			e.rt.SetFault(func(_ context.Context, method, sid string) error {
				if method == "agent:restore_repl" {
					return errors.New("the interpreter was killed (out of memory) while it loaded the session")
				}
				return nil
			})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hub := events.New(0)
			e := newEnv(t, func(cfg *Config) { cfg.Events = hub })
			ctx := context.Background()
			id, objs := e.pausedWith()
			from := hub.Last()
			c.fault(e)
			in := e.resumeOutcome(id)
			if in.Status != StatusPaused || in.Error != "" || in.Pause == nil || !strings.HasPrefix(in.Pause.Error, "resume failed: ") {
				t.Fatalf("after the failed resume: status %s, error %q, pause %+v; want paused with pause.error", in.Status, in.Error, in.Pause)
			}
			t.Logf("pause.error: %s", in.Pause.Error)
			// The record is written just after the status changes in memory (what Wait answers on).
			var rec store.Record
			var err error
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				rec, err = e.store.Get(ctx, id)
				if err == nil && Status(rec.Status) == StatusPaused || time.Now().After(deadline) {
					break
				}
			}
			if err != nil || Status(rec.Status) != StatusPaused || rec.Snapshot == "" || rec.Error != "" {
				t.Fatalf("the record says %s, snapshot %q, error %q (%v); want paused with its snapshot", rec.Status, rec.Snapshot, rec.Error, err)
			}
			if got := e.snaps.Keys(); strings.Join(got, ",") != strings.Join(objs, ",") {
				t.Fatalf("snapshot objects %v, want %v", got, objs)
			}
			if left := e.rt.IDs(); len(left) != 0 {
				t.Fatalf("the failed resume left %v in the runtime", left)
			}
			evs, _ := hub.Since(from)
			if len(evs) != 2 || evs[0].Type != events.Resuming || evs[1].Type != events.ResumeFailed ||
				evs[1].Status != string(StatusPaused) || evs[1].Error != in.Pause.Error {
				t.Fatalf("events %+v, want resuming then resume_failed (paused, with the error)", evs)
			}
			// Still a paused sandbox in every way: it can be forked paused, and run_code is refused as paused.
			if _, err := e.svc.RunCode(ctx, id, RunCodeRequest{Code: "x"}, nil); !errors.Is(err, errdefs.ErrConflict) {
				t.Fatalf("run_code on the paused sandbox: %v, want a conflict", err)
			}
			e.snaps.SetFault(nil)
			e.rt.SetFault(nil)
			if in := e.resumeOutcome(id); in.Status != StatusRunning || in.Pause == nil || in.Pause.Error != "" {
				t.Fatalf("the retried resume: %s, pause %+v; want running with pause.error cleared", in.Status, in.Pause)
			}
			if got := e.run(id, "x"); got != "41" {
				t.Fatalf("x = %q after the retried resume, want 41", got)
			}
		})
	}
}

// TestBrokenSnapshotResumeIsError: a snapshot that is itself broken (a part whose bytes are not the manifest's,
// a part missing) cannot be helped by trying again: the resume puts the sandbox in error with a clear reason
// and an error event, and keeps the snapshot; put right, it resumes from error.
func TestBrokenSnapshotResumeIsError(t *testing.T) {
	for _, c := range []struct{ name, part, want string }{
		{"corrupt layer", "layer.tar", "is corrupt"},
		{"corrupt session", "session.bin", "is corrupt"},
		{"missing session", "session.bin", "is missing"},
		{"missing manifest", "manifest.json", "has no manifest"},
	} {
		t.Run(c.name, func(t *testing.T) {
			hub := events.New(0)
			e := newEnv(t, func(cfg *Config) { cfg.Events = hub })
			ctx := context.Background()
			id, _ := e.pausedWith()
			rec, _ := e.store.Get(ctx, id)
			key := rec.Snapshot + c.part
			rc, err := e.snaps.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			orig := new(strings.Builder)
			_, err = io.Copy(orig, rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(c.name, "missing") {
				e.snaps.Delete(ctx, key) //nolint:errcheck // checked by the resume's outcome
			} else {
				b := []byte(orig.String())
				b[len(b)/2] ^= 0xff
				if _, err := e.snaps.Put(ctx, key, strings.NewReader(string(b))); err != nil {
					t.Fatal(err)
				}
			}
			from := hub.Last()
			in := e.resumeOutcome(id)
			if in.Status != StatusError || !strings.Contains(in.Error, c.want) {
				t.Fatalf("resume of a snapshot with a %s: status %s, error %q; want error saying %q", c.name, in.Status, in.Error, c.want)
			}
			t.Logf("error: %s", in.Error)
			evs, _ := hub.Since(from)
			if len(evs) != 2 || evs[1].Type != events.Error || evs[1].Error != in.Error {
				t.Fatalf("events %+v, want resuming then error", evs)
			}
			if r, _ := e.store.Get(ctx, id); r.Snapshot != rec.Snapshot {
				t.Fatalf("the record names snapshot %q, want %q kept", r.Snapshot, rec.Snapshot)
			}
			if _, err := e.snaps.Put(ctx, key, strings.NewReader(orig.String())); err != nil {
				t.Fatal(err)
			}
			if in := e.resumeOutcome(id); in.Status != StatusRunning || in.Error != "" {
				t.Fatalf("resume of the repaired snapshot: %s %q", in.Status, in.Error)
			}
			if got := e.run(id, "x"); got != "41" {
				t.Fatalf("x = %q, want 41", got)
			}
		})
	}
}

// TestRestartDuringResumeLeavesPaused: a server that stopped in the middle of a resume (its record says
// resuming, what the resume made of the sandbox may still be there) finds the sandbox paused as it starts, its
// snapshot kept, what was made of it removed, the interruption in pause.error; it then resumes with its state.
// A resume that had committed (its record says running) is running.
func TestRestartDuringResumeLeavesPaused(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	id, objs := e.pausedWith()
	done, _ := e.pausedWith()
	// The resume gets as far as the sandbox's interpreter loading its session, and the server stops there.
	held := make(chan struct{})
	e.rt.SetFault(func(ctx context.Context, method, sid string) error {
		if method == "agent:restore_repl" && sid == id {
			close(held)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	if _, _, err := e.svc.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	<-held
	rec, err := e.store.Get(ctx, id)
	if err != nil || Status(rec.Status) != StatusResuming {
		t.Fatalf("record during the resume: %s %v", rec.Status, err)
	}
	e.rt.SetFault(nil)
	e.resumeOutcome(done)
	e.svc.Close()
	// What a crash at that point leaves: the record says resuming, the half-resumed sandbox exists.
	if err := e.store.Put(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.Create(ctx, runtime.Spec{ID: id}); err != nil {
		t.Fatal(err)
	}
	e.start()
	in, err := e.svc.Get(ctx, id)
	if err != nil || in.Status != StatusPaused || in.Pause == nil || !strings.Contains(in.Pause.Error, "server restart") {
		t.Fatalf("after the restart: %+v %v; want paused, pause.error saying the restart", in, err)
	}
	if r, _ := e.store.Get(ctx, id); Status(r.Status) != StatusPaused || r.Snapshot != rec.Snapshot || len(r.Handle) > 2 {
		t.Fatalf("record after the restart: %s snapshot %q handle %s", r.Status, r.Snapshot, r.Handle)
	}
	if e.rt.Get(id) != nil || slices.Contains(e.rt.Layers(), id) {
		t.Fatalf("the half-resumed sandbox survived the restart: layers %v", e.rt.Layers())
	}
	for _, k := range objs {
		if _, err := e.snaps.Stat(ctx, k); err != nil && strings.HasPrefix(k, id) {
			t.Fatalf("snapshot object %s: %v", k, err)
		}
	}
	if st := e.status(done); st != StatusRunning {
		t.Fatalf("the sandbox whose resume committed is %s after the restart, want running", st)
	}
	if got := e.run(done, "x"); got != "41" {
		t.Fatalf("committed resume: x = %q", got)
	}
	if in := e.resumeOutcome(id); in.Status != StatusRunning {
		t.Fatalf("resume after the restart: %s %+v", in.Status, in.Pause)
	}
	if got := e.run(id, "x"); got != "41" {
		t.Fatalf("x = %q after the restart and resume, want 41", got)
	}
}

// TestLayerExtra: an older version's layer holding more than the quota is restored under a cap its size
// bounds; one within the quota gets nothing more than before.
func TestLayerExtra(t *testing.T) {
	for _, c := range []struct {
		tar     int64
		diskMiB int
		want    int64
	}{
		{10 << 20, 64, 0},
		{40 << 20, 64, 0},
		{192 << 20, 64, 288<<20 - 64<<20},
		{192 << 20, 0, 0},
	} {
		if got := layerExtra(c.tar, c.diskMiB); got != c.want {
			t.Errorf("layerExtra(%d, %d) = %d, want %d", c.tar, c.diskMiB, got, c.want)
		}
	}
}
