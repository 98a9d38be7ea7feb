package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// execBounded runs cmd with timeout_s (nil: the server's default) and a deadline of its own for the call, so that
// an exec that does not return fails the test instead of hanging it.
func execBounded(t *testing.T, s *testserver.Server, id, cmd string, timeoutS *int, limit time.Duration) (*client.ExecResult, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctxT(t), limit)
	defer cancel()
	start := time.Now()
	res, err := s.Client.Exec(ctx, id, client.ExecRequest{Cmd: cmd, TimeoutS: timeoutS})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("exec %q: %v after %s", cmd, err, took)
	}
	return res, took
}

// untilInSandbox runs a shell condition in the sandbox every 100 ms until it succeeds (true) or 20 s pass (false).
func untilInSandbox(t *testing.T, s *testserver.Server, id, cond string) bool {
	t.Helper()
	res := sh(t, s, id, "for i in $(seq 200); do if "+cond+"; then exit 0; fi; sleep 0.1; done; exit 1")
	return res.ExitCode == 0
}

// A timeout kills everything the command started, including processes that left its process group and session
// (setsid) and processes whose parent has exited meanwhile, and the call returns at once.
func TestExecTimeoutKillsEverything(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	two, four := 2, 4

	// A setsid'd child of the still running shell: before, exec waited for it (it held the output pipes).
	res, took := execBounded(t, s, id, "setsid sleep 617 & sleep 100", &two, 60*time.Second)
	if !res.TimedOut || took > 15*time.Second {
		t.Fatalf("exec with a setsid'd child: timed_out=%v after %s, want a timeout within 15s", res.TimedOut, took)
	}
	if !untilInSandbox(t, s, id, "! pgrep -f '^sleep 617$' >/dev/null") {
		t.Fatalf("the setsid'd child survived the timeout: %s", sh(t, s, id, "ps -eo pid,ppid,pgid,sid,args").Stdout)
	}

	// A setsid'd grandchild orphaned before the timeout (its parent exited after 1 s): not a descendant of the
	// command any more when the timeout comes, but started by it.
	res, took = execBounded(t, s, id, "sh -c 'setsid sleep 619 & sleep 1' & sleep 100", &four, 60*time.Second)
	if !res.TimedOut || took > 20*time.Second {
		t.Fatalf("exec with an orphaned setsid'd grandchild: timed_out=%v after %s", res.TimedOut, took)
	}
	if !untilInSandbox(t, s, id, "! pgrep -f '^sleep 619$' >/dev/null") {
		t.Fatalf("the orphaned setsid'd grandchild survived the timeout: %s", sh(t, s, id, "ps -eo pid,ppid,pgid,sid,args").Stdout)
	}

	// A daemon's double fork, after the command's first second: its parent exits at once and it leaves the
	// process group and session before the agent looks again.
	res, took = execBounded(t, s, id, "sleep 1; (setsid sleep 623 &); sleep 100", &two, 60*time.Second)
	if !res.TimedOut || took > 15*time.Second {
		t.Fatalf("exec with a double-forked daemon: timed_out=%v after %s", res.TimedOut, took)
	}
	if !untilInSandbox(t, s, id, "! pgrep -f '^sleep 623$' >/dev/null") {
		t.Fatalf("the double-forked daemon survived the timeout: %s", sh(t, s, id, "ps -eo pid,ppid,pgid,sid,args").Stdout)
	}

	// `setsid sleep 620` as the whole command: it did not return for minutes (the sleep kept the pipes open).
	if _, took = execBounded(t, s, id, "setsid sleep 620", &two, 60*time.Second); took > 15*time.Second {
		t.Fatalf("setsid sleep: returned after %s", took)
	}
	sh(t, s, id, "pkill -f '^sleep 620$'; true")

	// The output captured before the timeout comes back.
	res, _ = execBounded(t, s, id, "echo started; setsid sleep 621 & sleep 100", &two, 60*time.Second)
	if !res.TimedOut || res.Stdout != "started\n" {
		t.Fatalf("timed out exec = %+v, want its output so far", res)
	}
}

// A job started in the background keeps running after exec returns, as in a shell on a VM or in a container; exec
// returns when the command's main process exits, with its exit code and output.
func TestExecBackgroundJobsSurvive(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)

	res, _ := execBounded(t, s, id, "echo before; sleep 301 & echo after; exit 7", nil, 60*time.Second)
	if res.ExitCode != 7 || !strings.Contains(res.Stdout, "before\n") || !strings.Contains(res.Stdout, "after\n") {
		t.Fatalf("exec with a background job = %+v", res)
	}
	if r := sh(t, s, id, "pgrep -f '^sleep 301$'"); r.ExitCode != 0 {
		t.Fatalf("the background job died with its exec: %s", sh(t, s, id, "ps -eo pid,ppid,pgid,sid,args").Stdout)
	}

	// A server in the background answers after the exec that started it returned.
	execBounded(t, s, id, "cd /tmp && python3 -m http.server 8123 --bind 127.0.0.1 &", nil, 60*time.Second)
	probe := `python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8123/', timeout=2)" 2>/dev/null`
	if !untilInSandbox(t, s, id, probe) {
		t.Fatalf("the background http.server does not answer: %s", sh(t, s, id, "ps -eo pid,ppid,pgid,sid,args").Stdout)
	}

	// A background job that keeps writing to its (inherited) output after exec returned is not killed by a
	// broken pipe, and its output does not leak into later calls.
	execBounded(t, s, id, "(sleep 0.3; for i in $(seq 20); do echo late; echo late >&2; sleep 0.1; done; touch /tmp/bg-done) &", nil, 60*time.Second)
	for i := 0; i < 5; i++ {
		if r := sh(t, s, id, "echo hi"); r.Stdout != "hi\n" || r.Stderr != "" {
			t.Fatalf("a later exec got %+v", r)
		}
	}
	if !untilInSandbox(t, s, id, "test -e /tmp/bg-done") {
		t.Fatal("the writing background job did not finish (killed by SIGPIPE?)")
	}
}

// Output of any bytes stays within the output cap, whatever it escapes to in JSON, and never breaks the protocol
// between interpreter, agent and server.
func TestExecRunCodeOutputOfControlCharacters(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	const capBytes = 32 << 20
	encoded := func(s string) int { b, _ := json.Marshal(s); return len(b) }

	res, _ := execBounded(t, s, id, "head -c 12000000 /dev/zero", nil, 120*time.Second)
	if res.ExitCode != 0 || !strings.HasSuffix(res.Stdout, "[output truncated]\n") || encoded(res.Stdout) > capBytes+64 {
		t.Fatalf("exec of 12 MB of NULs: exit %d, %d bytes (%d encoded), ends %q", res.ExitCode, len(res.Stdout), encoded(res.Stdout), tailOf(res.Stdout))
	}
	// Streamed, on stderr: 6 MB of control characters, within the old cap in bytes but not in JSON.
	ctx := ctxT(t)
	n := 0
	sres, err := s.Client.ExecStream(ctx, id, client.ExecRequest{Cmd: "head -c 6000000 /dev/zero | tr '\\0' '\\1' >&2"}, func(ev client.Event) { n += len(ev.Data) })
	if err != nil || sres.ExitCode != 0 || n != 6000000 {
		t.Fatalf("streamed exec of 6 MB of control characters: %+v, %d bytes of events, %v", sres, n, err)
	}
	res, _ = execBounded(t, s, id, "head -c 6000000 /dev/zero | tr '\\0' '\\1' >&2", nil, 120*time.Second)
	if !strings.HasSuffix(res.Stderr, "[output truncated]\n") || encoded(res.Stderr) > capBytes+64 {
		t.Fatalf("exec of 6 MB of control characters on stderr: %d bytes (%d encoded)", len(res.Stderr), encoded(res.Stderr))
	}

	value(t, s, id, "keep = 'me'")
	ex := run(t, s, id, "print('\\x01' * 11_500_000)")
	if ex.Error != nil || !strings.HasSuffix(ex.Stdout, "[output truncated]\n") || encoded(ex.Stdout) > capBytes+64 {
		t.Fatalf("print of 11.5M control characters: error %+v, %d bytes (%d encoded)", ex.Error, len(ex.Stdout), encoded(ex.Stdout))
	}
	// A huge trailing value and a huge exception message come back shortened.
	ex = run(t, s, id, "'\\x01' * 20_000_000")
	if ex.Error != nil || ex.Value == nil || !strings.Contains(*ex.Value, "[output truncated]") {
		t.Fatalf("huge value: error %+v, value of %d bytes", ex.Error, len(deref(ex.Value)))
	}
	ex = run(t, s, id, "raise ValueError('<' * 20_000_000)")
	if ex.Error == nil || ex.Error.Name != "ValueError" {
		t.Fatalf("huge exception: error %+v", ex.Error)
	}
	if v := value(t, s, id, "keep"); v != "'me'" {
		t.Fatalf("the interpreter lost its variables: keep = %s", v)
	}
}

func tailOf(s string) string {
	if len(s) > 40 {
		return s[len(s)-40:]
	}
	return s
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
