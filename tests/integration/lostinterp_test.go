package integration

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// A sandbox whose interpreter died between calls (killed from a shell here; out of memory is the same): a fork
// or a template of it is a conflict that says the state is lost (409, not 500), a pause fails at once for a
// waiting client (it does not wait out its timeout) and leaves the sandbox running, and after each the next
// run_code says the interpreter died and the one after it runs in a fresh interpreter, which forks again.
func TestCallsOnALostInterpreter(t *testing.T) {
	s := testserver.Start(t, "--fork-ahead", "0")
	ctx := ctxT(t)
	id := create(t, s, nil)
	kill := func() {
		t.Helper()
		value(t, s, id, "x = 1")
		pid := value(t, s, id, "import os; os.getpid()")
		if _, err := strconv.Atoi(pid); err != nil {
			t.Fatalf("interpreter pid %q", pid)
		}
		if res := sh(t, s, id, "kill -9 "+pid+"; sleep 0.2"); res.ExitCode != 0 {
			t.Fatalf("kill the interpreter: %+v", res)
		}
	}
	recovered := func(what string) {
		t.Helper()
		if ex := run(t, s, id, "1"); ex.Error == nil || ex.Error.Name != "InterpreterDied" {
			t.Errorf("after the %s, the next run_code: %+v, want InterpreterDied", what, ex.Error)
		}
		if v := value(t, s, id, "'x' in globals()"); v != "False" {
			t.Errorf("after the %s, a fresh interpreter still has x: %s", what, v)
		}
	}
	wantLost := func(what string, err error) {
		t.Helper()
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.StatusCode != 409 || !strings.Contains(ae.Message, "state is lost") {
			t.Fatalf("%s of a sandbox whose interpreter died: %v, want a 409 saying its state is lost", what, err)
		}
	}

	kill()
	_, err := s.Client.Fork(ctx, id, 2)
	wantLost("fork", err)
	recovered("fork")
	if kids, err := s.Client.Fork(ctx, id, 1); err != nil || len(kids) != 1 {
		t.Fatalf("fork with a fresh interpreter: %v, %v", kids, err)
	}

	kill()
	_, err = s.Client.SaveTemplate(ctx, "lost-interp", id)
	wantLost("template", err)
	recovered("template")

	kill()
	if _, _, err := s.Client.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	sb, err := s.Client.WaitStatus(ctx, id, client.StatusPaused)
	var pe *client.PauseError
	if !errors.As(err, &pe) || sb == nil || sb.Status != client.StatusRunning {
		t.Fatalf("wait for the pause: %+v, %v; want a *client.PauseError with the sandbox running", sb, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the failed pause was reported after %s", d)
	}
	if !strings.Contains(sb.Pause.Error, "state is lost") {
		t.Errorf("pause.error = %q", sb.Pause.Error)
	}
	recovered("pause")
	if _, _, err := s.Client.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if sb, err := s.Client.WaitStatus(ctx, id, client.StatusPaused); err != nil || sb.Pause.Error != "" {
		t.Fatalf("pause with a fresh interpreter: %+v, %v", sb, err)
	}
}
