package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// TestPausedSessionsKeptReadyForResume: the packages a paused session imports as it loads are kept with its
// record, and the service tells the runtime about them as it starts (after a restart too) and while the sandbox
// stays paused, so that the runtime keeps them imported ahead for its resume; the API does not show them, and a
// resumed or deleted sandbox stops asking.
func TestPausedSessionsKeptReadyForResume(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	withNumpy, plain := e.create(), e.create()
	e.run(withNumpy, "np = 1")
	e.run(plain, "x = 1")
	for _, id := range []string{withNumpy, plain} {
		if _, _, err := e.svc.Pause(ctx, id); err != nil {
			t.Fatal(err)
		}
		e.waitFor(id, StatusPaused)
	}
	if n := e.rt.Prepared("numpy"); n != 1 {
		t.Fatalf("the pause asked the runtime %d times to ready numpy, want 1", n)
	}
	if in, _ := e.svc.Get(ctx, withNumpy); in.Pause == nil || in.Pause.Preload != nil {
		t.Fatalf("the API shows the pause as %+v: want it without the service's preload list", in.Pause)
	}
	if got := e.svc.pausedPreloads(); len(got) != 1 || len(got[0]) != 1 || got[0][0] != "numpy" {
		t.Fatalf("paused sessions import %v, want [[numpy]]", got)
	}

	// A restart: the new service asks at once, from the records.
	e.svc.Close()
	e.start()
	deadline := time.Now().Add(5 * time.Second)
	for e.rt.Prepared("numpy") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("after a restart the service never asked the runtime to ready numpy for the paused sandbox")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e.rt.Prepared("") != 0 {
		t.Fatal("the service asked the runtime to ready nothing, for the sandbox whose session needs no package")
	}

	// Resumed, it needs nothing any more.
	if _, _, err := e.svc.Resume(ctx, withNumpy); err != nil {
		t.Fatal(err)
	}
	e.waitFor(withNumpy, StatusRunning)
	if got := e.svc.pausedPreloads(); len(got) != 0 {
		t.Fatalf("after the resume paused sessions import %v, want none", got)
	}
	if e.run(withNumpy, "np") != "1" {
		t.Fatal("the session did not come back")
	}
}

// TestResumedSandboxAnswersBeforeItsSnapshotIsDeleted: a resumed sandbox takes calls at once; its spent
// snapshot is deleted off its lifecycle (a large one took a second, which every call waited for), and is gone
// once that is done.
func TestResumedSandboxAnswersBeforeItsSnapshotIsDeleted(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	id := e.create()
	e.run(id, "x = 41")
	if _, _, err := e.svc.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	e.waitFor(id, StatusPaused)
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	deleting := make(chan string, 1)
	e.snaps.SetFault(func(ctx context.Context, method, key string) error {
		if method == "Delete" {
			deleting <- key
			<-release
		}
		return nil
	})
	if _, _, err := e.svc.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	e.waitFor(id, StatusRunning)
	select {
	case <-deleting:
	case <-time.After(5 * time.Second):
		t.Fatal("the spent snapshot is never deleted")
	}
	answered := make(chan string, 1)
	go func() {
		ex, err := e.svc.RunCode(ctx, id, RunCodeRequest{Code: "x"}, nil)
		if err != nil || ex.Value == nil {
			answered <- fmt.Sprintf("%+v, %v", ex, err)
			return
		}
		answered <- *ex.Value
	}()
	select {
	case v := <-answered:
		if v != "41" {
			t.Errorf("a call while the spent snapshot is being deleted: %s, want 41", v)
		}
		close(release)
	case <-time.After(2 * time.Second):
		close(release)
		t.Errorf("a call to the resumed sandbox waited for its spent snapshot's deletion (answered once it was done: %s)", <-answered)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(e.snaps.Keys()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("snapshot objects left after the deletion: %v", e.snaps.Keys())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestDeletingAPausedSandboxDoesNotWaitForItsSnapshot: a DELETE of a paused sandbox answers once its record is
// retired; its snapshot goes in the background, and one a crash left behind is reclaimed at the next start,
// on a store shared with other servers too (the id is one this server retired).
func TestDeletingAPausedSandboxDoesNotWaitForItsSnapshot(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	ids := []string{e.create(), e.create()}
	for _, id := range ids {
		e.run(id, "x = 1")
		if _, _, err := e.svc.Pause(ctx, id); err != nil {
			t.Fatal(err)
		}
		e.waitFor(id, StatusPaused)
	}
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	e.snaps.SetFault(func(ctx context.Context, method, key string) error {
		if method == "Delete" {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return errors.New("the disk is gone") // as a crash would leave it: not deleted
		}
		return nil
	})
	deleted := make(chan error, 1)
	go func() { deleted <- e.svc.Delete(ctx, ids[0]) }()
	select {
	case err := <-deleted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		unblock()
		t.Fatalf("the DELETE of a paused sandbox waited for its snapshot's deletion (%v once released)", <-deleted)
	}
	if _, err := e.svc.Get(ctx, ids[0]); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the deleted sandbox: %v, want not found", err)
	}
	unblock()
	e.svc.Close()
	e.snaps.SetFault(nil)
	left := func(id string) bool {
		return slices.ContainsFunc(e.snaps.Keys(), func(k string) bool { return strings.HasPrefix(k, id+"/") })
	}
	if !left(ids[0]) {
		t.Fatal("the failed deletion deleted the snapshot after all: the test left nothing to reclaim")
	}
	e.cfg.SnapshotsExclusive = false // a shared store: only this server's ids are its to delete
	e.start()
	if left(ids[0]) {
		t.Errorf("the deleted sandbox's snapshot is still there after a restart")
	}
	if !left(ids[1]) {
		t.Errorf("the paused sandbox's snapshot was reclaimed")
	}
}
