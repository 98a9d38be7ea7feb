package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// POST /interrupt stops what runs: a run_code gets a KeyboardInterrupt and the interpreter keeps its variables;
// an exec's command and what it started (here a setsid'd grandchild) are killed; a run_code queued behind a
// long one fails at its own timeout without running.
func TestInterrupt(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	ctx := ctxT(t)
	value(t, s, id, "x = 'kept'")

	type result struct {
		ex  *client.Execution
		err error
	}
	// startRun starts a run_code and returns once its first output arrived, so the call is surely running.
	startRun := func(code string) chan result {
		started := make(chan struct{})
		done := make(chan result, 1)
		go func() {
			var once bool
			ex, err := s.Client.RunCodeStream(ctx, id, client.RunCodeRequest{Code: code}, func(client.Event) {
				if !once {
					once = true
					close(started)
				}
			})
			if !once {
				close(started)
			}
			done <- result{ex, err}
		}()
		<-started
		return done
	}

	t.Run("RunCode", func(t *testing.T) {
		done := startRun("import time\nprint('started', flush=True)\nwhile True: time.sleep(0.05)")
		n, err := s.Client.Interrupt(ctx, id, client.InterruptAll)
		if err != nil || n.RunCode != 1 || n.Exec != 0 {
			t.Fatalf("interrupt: %+v, %v; want one run_code", n, err)
		}
		r := <-done
		if r.err != nil || r.ex.Error == nil || r.ex.Error.Name != "KeyboardInterrupt" || !r.ex.Interrupted {
			t.Fatalf("the interrupted run_code answered %+v, %v", r.ex, r.err)
		}
		if v := value(t, s, id, "x"); v != "'kept'" {
			t.Errorf("the interpreter after an interrupt: x = %s", v)
		}
	})

	t.Run("Exec", func(t *testing.T) {
		done := make(chan *client.ExecResult, 1)
		started := make(chan struct{})
		go func() {
			var once bool
			res, err := s.Client.ExecStream(ctx, id, client.ExecRequest{
				Cmd: "setsid sleep 600 & echo started; sleep 600"}, func(client.Event) {
				if !once {
					once = true
					close(started)
				}
			})
			if err != nil {
				t.Errorf("exec: %v", err)
			}
			if !once {
				close(started)
			}
			done <- res
		}()
		<-started
		// Interrupting run_code only leaves the exec alone.
		if n, err := s.Client.Interrupt(ctx, id, client.InterruptRunCode); err != nil || n != (client.Interrupted{}) {
			t.Fatalf("interrupt run_code only: %+v, %v; want nothing stopped", n, err)
		}
		n, err := s.Client.Interrupt(ctx, id, client.InterruptExec)
		if err != nil || n.Exec != 1 {
			t.Fatalf("interrupt exec: %+v, %v; want one exec", n, err)
		}
		res := <-done
		if res == nil || !res.Interrupted || res.TimedOut {
			t.Fatalf("the interrupted exec answered %+v", res)
		}
		// SIGKILL is sent before exec answers; the dead are reaped a moment later.
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			out := strings.TrimSpace(sh(t, s, id, "pgrep -c -x sleep || true").Stdout)
			if out == "0" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s sleep processes outlived the interrupted exec", out)
			}
		}
	})

	t.Run("QueuedCallHasItsOwnTimeout", func(t *testing.T) {
		long := startRun("import time\nprint('started', flush=True)\ntime.sleep(600)")
		timeout := 1
		ex, err := s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: "y = 1", TimeoutS: &timeout})
		if err != nil || ex.Error == nil || ex.Error.Name != "TimeoutError" || !strings.Contains(ex.Error.Value, "did not run") {
			t.Fatalf("the queued run_code answered %+v, %v; want a TimeoutError without running", ex, err)
		}
		select {
		case r := <-long:
			t.Fatalf("the long run_code ended before the queued one timed out: %+v %v", r.ex, r.err)
		default:
		}
		if n, err := s.Client.Interrupt(ctx, id, client.InterruptAll); err != nil || n.RunCode != 1 {
			t.Fatalf("interrupt: %+v, %v", n, err)
		}
		<-long
		if v := value(t, s, id, "'y' in globals()"); v != "False" {
			t.Errorf("the queued code ran after all: 'y' in globals() = %s", v)
		}
	})

	t.Run("BadInput", func(t *testing.T) {
		code, body := raw(t, s, "POST", "/v1/sandboxes/"+id+"/interrupt", s.Key, []byte(`{"what":"everything"}`))
		wantError(t, code, body, 400, "what must be")
		code, body = raw(t, s, "POST", "/v1/sandboxes/sbx_missing/interrupt", s.Key, nil)
		wantError(t, code, body, 404, "")
	})
}
