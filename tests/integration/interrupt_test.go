package integration

import (
	"context"
	"fmt"
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

// An interrupt that comes as a cell's code has just ended (the interpreter blocks SIGINT again there) but before
// the agent has its result stops nothing, and must not hit the next cell either: that cell used to fail at once
// with a KeyboardInterrupt, its code not run. The cell here widens that window to seconds: its sys.stdout's
// flush, which the interpreter calls after the code, says so and sleeps. Each way a run is interrupted: its
// timeout, its caller going away, POST /interrupt. An interrupt aimed at the next cell still stops it.
func TestInterruptAsCellEndsSparesNextCell(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	ctx := ctxT(t)
	value(t, s, id, "1") // the interpreter started, its first run's costs paid
	const ended = "cell code ended"
	late := func(sleepS float64) string {
		return fmt.Sprintf(`import sys, time
class _Late:
    def __init__(self, out):
        self.out = out
    def write(self, s):
        return self.out.write(s)
    def flush(self):  # called once the cell's code is done, SIGINT blocked again
        self.out.write(%q + "\n")
        time.sleep(%g)
sys.stdout = _Late(sys.stdout)
`, ended, sleepS)
	}
	// runLate runs a late cell, calling at once when it says its code ended, and returns its answer.
	runLate := func(ctx context.Context, sleepS float64, timeoutS *int, at func()) (*client.Execution, error) {
		var once bool
		return s.Client.RunCodeStream(ctx, id, client.RunCodeRequest{Code: late(sleepS), TimeoutS: timeoutS},
			func(ev client.Event) {
				if !once && strings.Contains(ev.Data, ended) {
					once = true
					at()
				}
			})
	}
	next := func(t *testing.T) {
		t.Helper()
		ex, err := s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: "'next cell ran'"})
		if err != nil || ex.Error != nil || ex.Value == nil || *ex.Value != "'next cell ran'" {
			if ex != nil && ex.Error != nil {
				t.Fatalf("the next run_code failed: %s: %s\n%s", ex.Error.Name, ex.Error.Value, ex.Error.Traceback)
			}
			t.Fatalf("the next run_code answered %+v, %v", ex, err)
		}
	}

	t.Run("Timeout", func(t *testing.T) {
		ex, err := runLate(ctx, 3, client.Int(1), func() {})
		if err != nil || ex.Error != nil {
			t.Fatalf("the late cell answered %+v, %v", ex, err)
		}
		next(t)
	})

	t.Run("CallerGoesAway", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if _, err := runLate(cctx, 2, nil, cancel); err == nil {
			t.Fatal("the abandoned run_code answered")
		}
		next(t) // queued behind the abandoned cell, which ends ~2 s after it was interrupted
	})

	t.Run("Interrupt", func(t *testing.T) {
		interrupted := make(chan client.Interrupted, 1)
		ex, err := runLate(ctx, 1, nil, func() {
			n, err := s.Client.Interrupt(ctx, id, client.InterruptRunCode)
			if err != nil {
				t.Errorf("interrupt: %v", err)
			}
			interrupted <- n
		})
		select {
		case n := <-interrupted:
			if n.RunCode != 1 {
				t.Fatalf("interrupt: %+v; want one run_code", n)
			}
		default:
			t.Fatalf("the late cell never said its code ended: %+v, %v", ex, err)
		}
		if err != nil || ex.Error != nil {
			t.Fatalf("the late cell answered %+v, %v", ex, err)
		}
		next(t)
		// The next interrupt is not lost: it stops the cell it was sent to.
		done := make(chan *client.Execution, 1)
		started := make(chan struct{})
		go func() {
			var once bool
			ex, err := s.Client.RunCodeStream(ctx, id, client.RunCodeRequest{
				Code: "import time\nprint('started', flush=True)\nwhile True: time.sleep(0.05)"}, func(client.Event) {
				if !once {
					once = true
					close(started)
				}
			})
			if err != nil {
				t.Errorf("run_code: %v", err)
			}
			if !once {
				close(started)
			}
			done <- ex
		}()
		<-started
		if n, err := s.Client.Interrupt(ctx, id, client.InterruptRunCode); err != nil || n.RunCode != 1 {
			t.Fatalf("interrupt: %+v, %v; want one run_code", n, err)
		}
		if ex := <-done; ex == nil || ex.Error == nil || ex.Error.Name != "KeyboardInterrupt" || !ex.Interrupted {
			t.Fatalf("the interrupted run_code answered %+v", ex)
		}
		next(t)
	})
}
