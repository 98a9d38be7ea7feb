package sandbox

import (
	"context"
	"testing"
	"time"
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
