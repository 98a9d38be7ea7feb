package integration

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// A sandbox whose disk quota is full pauses and resumes like any other (the pause once failed there: the
// interpreter's import of dill asks tempfile for a directory, which probes by writing a file; before the wait
// learnt of failed pauses, that pause also held the sandbox in pausing for good).
func TestPauseOfAFullDisk(t *testing.T) {
	s := testserver.Start(t, "--fork-ahead", "0")
	ctx := ctxT(t)
	id := create(t, s, &client.CreateRequest{DiskMiB: 64})
	value(t, s, id, "v = 'keep-me'")
	if out := sh(t, s, id, "dd if=/dev/zero of=/root/fill bs=1M 2>&1 | tail -1; echo tail > /root/t || echo full").Stdout; !strings.Contains(out, "full") {
		t.Fatalf("the disk did not fill: %q", out)
	}
	if _, _, err := s.Client.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if sb, err := s.Client.WaitStatus(ctx, id, client.StatusPaused); err != nil {
		t.Fatalf("pause of a full disk: %+v, %v", sb, err)
	}
	if _, _, err := s.Client.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.WaitStatus(ctx, id, client.StatusRunning); err != nil {
		t.Fatal(err)
	}
	if v := value(t, s, id, "v"); v != "'keep-me'" {
		t.Errorf("state after the resume: %s", v)
	}
	if out := sh(t, s, id, "stat -c %s /root/fill").Stdout; strings.TrimSpace(out) == "0" || out == "" {
		t.Errorf("the filled file after the resume: %q", out)
	}
	// Its root is writable (it came back read-only once: the overlay could not make its work directory in a
	// layer restored up to its quota): the user can make room, then write.
	if res := sh(t, s, id, "rm /root/fill && echo ok > /root/after && cat /root/after"); res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "ok" {
		t.Errorf("writing after the resume: %+v", res)
	}
	// A fork of a full sandbox gives children that can make room and write too.
	sh(t, s, id, "dd if=/dev/zero of=/root/fill bs=1M 2>/dev/null; true")
	kids, err := s.Client.Fork(ctx, id, 1)
	if err != nil {
		t.Fatalf("fork of a full disk: %v", err)
	}
	if res := sh(t, s, kids[0], "rm /root/fill && echo ok > /root/x && cat /root/x"); res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "ok" {
		t.Errorf("writing in the child of a full disk: %+v", res)
	}
	// Both are still held to their quota (it is set once their roots are mounted).
	for _, sbx := range []string{id, kids[0]} {
		if out := sh(t, s, sbx, "rm -f /root/fill; dd if=/dev/zero of=/root/big bs=1M count=100 2>&1").Stdout; !strings.Contains(out, "quota") {
			t.Errorf("%s wrote 100 MiB under a 64 MiB quota: %q", sbx, out)
		}
	}
}

// A pause held up by the sandbox itself (a thread that holds the interpreter's lock in a catastrophic regular
// expression, so the save never starts) does not make the sandbox undeletable: a delete stops the pause, which
// rolls back, and deletes the sandbox within seconds.
func TestDeleteStopsAPauseHeldByTheSandbox(t *testing.T) {
	s := testserver.Start(t, "--fork-ahead", "0")
	ctx := ctxT(t)
	id := create(t, s, nil)
	// The thread waits a second first, so that this run_code answers before it takes the lock for good.
	run(t, s, id, "import re, threading, time\n"+
		"threading.Thread(target=lambda: (time.sleep(1), re.match(r'(a+)+$', 'a' * 64 + 'b')), daemon=True).start()")
	time.Sleep(1500 * time.Millisecond)
	if _, _, err := s.Client.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if sb, err := s.Client.Get(ctx, id); err != nil || sb.Status != "pausing" {
		t.Fatalf("the held pause: %+v, %v", sb, err)
	}
	start := time.Now()
	if err := s.Client.Delete(ctx, id); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("the delete waited %s for the held pause", d)
	}
	if _, err := s.Client.Get(ctx, id); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get after the delete: %v", err)
	}
}

// A pause of a sandbox whose interpreter cannot answer (code left a thread holding the GIL in C code: a
// regular expression that backtracks for ever) fails after --interpreter-stall-timeout, instead of leaving the sandbox
// pausing for good; the sandbox runs on, the stuck interpreter is replaced (the next run_code says its state was
// lost), and the sandbox pauses normally afterwards. Before, it stayed "pausing" for as long as the thread ran,
// and every call waited behind it.
func TestPauseOfAStuckInterpreterFails(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0", "--fork-ahead", "0", "--interpreter-stall-timeout", "2s")
	ctx := ctxT(t)
	id := create(t, s, nil)
	value(t, s, id, "import threading, re, time\nthreading.Thread(target=lambda: (time.sleep(0.5), re.match(r'(a+)+$', 'a' * 60 + 'b')), daemon=True).start()")
	time.Sleep(time.Second) // the thread holds the GIL now
	if _, _, err := s.Client.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	sb, err := s.Client.WaitStatus(wctx, id, client.StatusPaused)
	var pe *client.PauseError
	if !errors.As(err, &pe) || sb == nil || sb.Status != client.StatusRunning || sb.Pause == nil ||
		!strings.Contains(sb.Pause.Error, "sent nothing of its session") {
		t.Fatalf("a pause of a stuck interpreter: %+v %v, want it failed with the sandbox running", sb, err)
	}
	// The stuck interpreter is killed a few seconds after the pause gave up; the next run_code says so, and the
	// one after runs.
	ex := run(t, s, id, "1")
	if ex.Error == nil || ex.Error.Name != "InterpreterDied" {
		t.Errorf("the first run_code after the failed pause: %+v, want InterpreterDied", ex)
	}
	if v := value(t, s, id, "x = 5\nx"); v != "5" {
		t.Fatalf("a run_code on the fresh interpreter: %s", v)
	}
	if _, _, err := s.Client.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.WaitStatus(wctx, id, client.StatusPaused); err != nil {
		t.Fatalf("a pause after the failed one: %v", err)
	}
}

// A fork of a sandbox whose interpreter cannot answer (as above) fails after --interpreter-stall-timeout with a
// 409 that says why, leaving nothing behind, and a DELETE stops such a fork at once. Before, the fork waited for
// ever, and held its parent: the sandbox could not even be deleted.
func TestForkOfAStuckInterpreter(t *testing.T) {
	stuck := func(t *testing.T, s *testserver.Server) string {
		id := create(t, s, nil)
		value(t, s, id, "import threading, re, time\nthreading.Thread(target=lambda: (time.sleep(0.5), re.match(r'(a+)+$', 'a' * 60 + 'b')), daemon=True).start()")
		time.Sleep(time.Second) // the thread holds the GIL now
		return id
	}
	t.Run("fails after the stall timeout", func(t *testing.T) {
		s := testserver.Start(t, "--warm-pool", "0", "--fork-ahead", "0", "--interpreter-stall-timeout", "2s")
		id := stuck(t, s)
		fctx, cancel := context.WithTimeout(ctxT(t), 60*time.Second)
		defer cancel()
		_, err := s.Client.Fork(fctx, id, 2)
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.StatusCode != 409 || !strings.Contains(ae.Message, "did not answer the fork") {
			t.Fatalf("a fork of a stuck interpreter: %v, want 409 saying it did not answer", err)
		}
		if ex := run(t, s, id, "1"); ex.Error == nil || ex.Error.Name != "InterpreterDied" {
			t.Errorf("the first run_code after the failed fork: %+v, want InterpreterDied", ex)
		}
		if v := value(t, s, id, "1 + 1"); v != "2" {
			t.Errorf("a run_code on the fresh interpreter: %s", v)
		}
		checkNoLeftovers(t, s, expect{}) // the parent alone, and none of the children
	})
	t.Run("a delete stops it", func(t *testing.T) {
		s := testserver.Start(t, "--warm-pool", "0", "--fork-ahead", "0", "--interpreter-stall-timeout", "10m")
		id := stuck(t, s)
		errs := make(chan error, 1)
		go func() {
			_, err := s.Client.Fork(ctxT(t), id, 2)
			errs <- err
		}()
		time.Sleep(2 * time.Second) // the fork waits on the interpreter
		start := time.Now()
		dctx, cancel := context.WithTimeout(ctxT(t), 30*time.Second)
		defer cancel()
		if err := s.Client.Delete(dctx, id); err != nil {
			t.Fatalf("delete of a sandbox with a fork in flight: %v after %v", err, time.Since(start))
		}
		select {
		case err := <-errs:
			var ae *client.APIError
			if !errors.As(err, &ae) || ae.StatusCode != 409 || !strings.Contains(ae.Message, "was deleted while the call ran") {
				t.Errorf("the fork in flight during the delete: %v, want 409 saying the sandbox was deleted", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the fork in flight did not answer after the delete")
		}
		checkNoLeftovers(t, s, expect{})
	})
}

// A pause saves the interpreter's session from a copy of it that the server gives a memory budget of its own
// (twice mem_mib): a session whose saving needs more memory than the sandbox has left (the pickler's memo holds
// every object saved) pauses, and one whose saving needs more than that budget fails alone, the sandbox running on
// with its state. Before, the save ran in the interpreter itself: a dict of two million strings using 60% of a
// 512 MiB sandbox got the interpreter OOM-killed, and the session the pause was to keep was lost.
func TestPauseSavesWithinAMemoryBudgetOfItsOwn(t *testing.T) {
	s := testserver.Start(t, "--fork-ahead", "0")
	ctx, cancel := context.WithTimeout(ctxT(t), 4*time.Minute)
	defer cancel()
	t.Run("a session using most of the sandbox's memory pauses and resumes", func(t *testing.T) {
		id := create(t, s, &client.CreateRequest{MemMiB: 512})
		value(t, s, id, "d = {('k%d' % i): ('v%d' % i) * 3 for i in range(2_000_000)}\n1")
		pauseAndWait(t, s, id)
		resumeAndWait(t, s, id)
		if v := value(t, s, id, "(len(d), d['k1999999'])"); v != "(2000000, 'v1999999v1999999v1999999')" {
			t.Fatalf("the session after the resume: %s", v)
		}
		if err := s.Client.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a save that needs more than its budget fails alone", func(t *testing.T) {
		id := create(t, s, &client.CreateRequest{MemMiB: 256})
		// An object whose saving (its own code, run by the pickler) takes 1 GiB: past the 512 MiB a save of this
		// sandbox may use.
		value(t, s, id, `keep = list(range(100000))
class Hog:
    def __reduce__(self):
        junk = bytearray(1 << 30)
        junk[::4096] = b"x" * (len(junk) // 4096)
        return (Hog, ())
hog = Hog()
1`)
		pid := value(t, s, id, "import os; os.getpid()")
		if _, _, err := s.Client.Pause(ctx, id); err != nil {
			t.Fatal(err)
		}
		sb, err := s.Client.WaitStatus(ctx, id, client.StatusPaused)
		var pe *client.PauseError
		if !errors.As(err, &pe) || sb == nil || sb.Status != client.StatusRunning || sb.Pause == nil ||
			!strings.Contains(sb.Pause.Error, "needs more memory than the 512 MiB a save may use") {
			t.Fatalf("a pause whose save needs 1 GiB: %+v %v, want it failed with the sandbox running", sb, err)
		}
		// The same interpreter, with its state: nothing was lost, nothing of the save's memory is left.
		if v := value(t, s, id, "(os.getpid(), len(keep), type(hog).__name__)"); v != "("+pid+", 100000, 'Hog')" {
			t.Fatalf("the session after the failed pause: %s (interpreter pid was %s)", v, pid)
		}
		if leftover, _ := filepath.Glob("/sys/fs/cgroup/memory/ramify/*/*-save"); len(leftover) > 0 {
			t.Errorf("save cgroups left: %v", leftover)
		}
		// A save whose own code leaves a process behind, holding the session's stream open, ends when the copy
		// answers: what the copy left is killed with its cgroup (the store's read waited for the stall timeout).
		value(t, s, id, `del hog
class Leaver:
    def __reduce__(self):
        import time
        if os.fork() == 0:
            time.sleep(1000)
            os._exit(0)
        return (Leaver, ())
leaver = Leaver()
1`)
		start := time.Now()
		pauseAndWait(t, s, id)
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("a pause whose save left a process holding its stream took %v", d)
		}
		resumeAndWait(t, s, id)
		if v := value(t, s, id, "(len(keep), type(leaver).__name__)"); v != "(100000, 'Leaver')" {
			t.Fatalf("after the resume: %s", v)
		}
		value(t, s, id, "del leaver\n1")
		// Without them it pauses.
		pauseAndWait(t, s, id)
		resumeAndWait(t, s, id)
		if v := value(t, s, id, "len(keep)"); v != "100000" {
			t.Fatalf("after the resume: %s", v)
		}
	})
}

// A save that trickles (an object's __reduce__, run by the save copy, holding each piece back just short of the
// stall timeout) kept the sandbox pausing, and its save copy's memory budget (twice mem_mib) held, for as long
// as it liked: once the save has run for --interpreter-stall-timeout it must average 1 MiB/s, else the pause
// fails and the sandbox runs on with its state.
func TestPauseThatTricklesFails(t *testing.T) {
	s := testserver.Start(t, "--fork-ahead", "0", "--interpreter-stall-timeout", "3s")
	ctx, cancel := context.WithTimeout(ctxT(t), 2*time.Minute)
	defer cancel()
	id := create(t, s, nil)
	value(t, s, id, `import time
class Trickle:
    def __init__(self, n):
        self.n = n
    def __reduce__(self):
        time.sleep(2)  # 1 MiB every 2 s: under the 3 s stall wait, under 1 MiB/s
        return (Trickle, (self.n,), {"pad": b"x" * (1 << 20)})
keep = 42
slow = [Trickle(i) for i in range(30)]
1`)
	start := time.Now()
	if _, _, err := s.Client.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	sb, err := s.Client.WaitStatus(ctx, id, client.StatusPaused)
	var pe *client.PauseError
	if !errors.As(err, &pe) || sb == nil || sb.Status != client.StatusRunning || sb.Pause == nil ||
		!strings.Contains(sb.Pause.Error, "too slowly") {
		t.Fatalf("a pause that trickles: %+v %v after %v, want it failed as too slow with the sandbox running", sb, err, time.Since(start))
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the trickling pause failed only after %v", d)
	}
	if v := value(t, s, id, "(keep, len(slow))"); v != "(42, 30)" {
		t.Fatalf("the session after the failed pause: %s", v)
	}
}
