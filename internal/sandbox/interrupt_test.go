package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/errdefs"
)

// interruptUntil interrupts what in id until a call of that kind was in flight to stop (the caller's goroutine
// may not have reached the agent yet), and returns the count.
func interruptUntil(t *testing.T, e *env, id, what string) agent.Interrupted {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		n, err := e.svc.Interrupt(context.Background(), id, what)
		if err != nil {
			t.Fatalf("interrupt %s: %v", id, err)
		}
		if n != (agent.Interrupted{}) {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("interrupt %q of %s found nothing in flight", what, id)
		}
	}
}

// Interrupt stops only the calls it names, in flight in the sandbox it names; each answers as interrupted.
func TestInterruptStopsCallsInFlight(t *testing.T) {
	e := newEnv(t, nil)
	a, b := e.create(), e.create()
	ctx := context.Background()

	runs := make(chan Execution, 2)
	for _, id := range []string{a, b} {
		go func() {
			ex, err := e.svc.RunCode(ctx, id, RunCodeRequest{Code: "wait never"}, nil)
			if err != nil {
				t.Errorf("run_code: %v", err)
			}
			runs <- ex
		}()
	}
	execs := make(chan ExecResult, 1)
	go func() {
		res, err := e.svc.Exec(ctx, a, ExecRequest{Cmd: "wait never"}, nil)
		if err != nil {
			t.Errorf("exec: %v", err)
		}
		execs <- res
	}()

	if n := interruptUntil(t, e, a, agent.InterruptExec); n.Exec != 1 || n.RunCode != 0 {
		t.Fatalf("interrupt exec: %+v", n)
	}
	if res := <-execs; !res.Interrupted {
		t.Errorf("the interrupted exec answered %+v", res)
	}
	if n := interruptUntil(t, e, a, agent.InterruptAll); n.RunCode != 1 || n.Exec != 0 {
		t.Fatalf("interrupt all: %+v", n)
	}
	ex := <-runs
	if !ex.Interrupted || ex.Error == nil || ex.Error.Name != "KeyboardInterrupt" {
		t.Errorf("the interrupted run_code answered %+v", ex)
	}
	select {
	case ex := <-runs:
		t.Fatalf("interrupting %s stopped a call in %s: %+v", a, b, ex)
	default:
	}
	interruptUntil(t, e, b, agent.InterruptRunCode)
	<-runs

	if _, err := e.svc.Interrupt(ctx, a, "everything"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("interrupt with a bad target: %v, want invalid", err)
	}
	if _, err := e.svc.Interrupt(ctx, "sbx_missing", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("interrupt of a missing sandbox: %v, want not found", err)
	}
}
