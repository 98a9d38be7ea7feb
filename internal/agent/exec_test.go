package agent

import (
	"context"
	"encoding/json"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"
)

// These tests run exec in the test process itself (no sandbox, no spawner thread): they need only /bin/sh,
// setsid and sleep.

func runExec(t *testing.T, req Request) (Event, []Event) {
	t.Helper()
	a := &Agent{}
	if req.Cwd == "" {
		req.Cwd = t.TempDir()
	}
	var events []Event
	ev := a.exec(context.Background(), req, func(e Event) { events = append(events, e) })
	return ev, events
}

// readPid waits (bounded) for a command to write a pid into file.
func readPid(t *testing.T, file string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(file)
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			return pid
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no pid in %s", file)
	return 0
}

// alive reports whether pid runs (a zombie counts as gone).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	st, ok := parseStat(pid, b)
	return ok && st.state != 'Z' && st.state != 'X'
}

// goneWithin waits until pid is gone, at most limit.
func goneWithin(pid int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for alive(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

func killLater(t *testing.T, pid int) {
	t.Cleanup(func() {
		if alive(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

func TestExecTimeoutKillsSetsidAndOrphanedProcesses(t *testing.T) {
	dir := t.TempDir()
	a, b, c := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")
	// a: a setsid'd child of the running shell; b: a setsid'd grandchild whose parent exits after 0.5 s (an
	// orphan when the timeout comes); c: a daemon's double fork (its parent, a subshell, exits at once), done
	// when the tracker looks only every few hundred ms.
	cmd := "setsid sh -c 'echo $$ > " + a + "; exec sleep 100' & " +
		"sh -c \"setsid sh -c 'echo \\$\\$ > " + b + "; exec sleep 100' & sleep 0.5\" & " +
		"sleep 1.5; (setsid sh -c 'echo $$ > " + c + "; exec sleep 100' &); sleep 100"
	start := time.Now()
	ev, _ := runExec(t, Request{Cmd: cmd, TimeoutS: 2})
	took := time.Since(start)
	pa, pb, pc := readPid(t, a), readPid(t, b), readPid(t, c)
	killLater(t, pa)
	killLater(t, pb)
	killLater(t, pc)
	if !ev.TimedOut || took > 15*time.Second {
		t.Fatalf("exec = %+v after %s, want a timeout within 15s", ev, took)
	}
	for what, pid := range map[string]int{"setsid'd child": pa, "orphaned setsid'd grandchild": pb, "double-forked daemon": pc} {
		if !goneWithin(pid, 10*time.Second) {
			t.Errorf("the %s %d survived the timeout", what, pid)
		}
	}
}

func TestExecReturnsAndLeavesBackgroundJobsRunning(t *testing.T) {
	dir := t.TempDir()
	pidFile, release, done := filepath.Join(dir, "pid"), filepath.Join(dir, "release"), filepath.Join(dir, "done")
	// The job keeps writing to the call's stdout and stderr until the test releases it, after the call returned:
	// it must not die of SIGPIPE. Were exec to wait for it, the call would end at its timeout instead.
	cmd := "echo before; (sh -c 'echo $$ > " + pidFile + "; while [ ! -e " + release + " ]; do echo late; echo late >&2; sleep 0.05; done; touch " + done + "; exec sleep 100') & echo after; exit 3"
	ev, events := runExec(t, Request{Cmd: cmd, TimeoutS: 60})
	pid := readPid(t, pidFile)
	killLater(t, pid)
	if ev.ExitCode != 3 || ev.TimedOut || !strings.Contains(ev.Stdout, "before\n") || !strings.Contains(ev.Stdout, "after\n") {
		t.Fatalf("exec = %+v (timed out: it waited for its background job)", ev)
	}
	n := len(events)
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(done); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the background job did not finish writing (killed by a broken pipe?)")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !alive(pid) {
		t.Fatal("the background job died with its exec")
	}
	if len(events) != n {
		t.Errorf("%d events were sent after exec returned", len(events)-n)
	}
}

func TestExecStdinWithBackgroundReader(t *testing.T) {
	// A background job that inherits stdin and never reads it does not hold the call (were it to, the call
	// would end at its timeout).
	pidFile := filepath.Join(t.TempDir(), "pid")
	big := strings.Repeat("x", 1<<20)
	ev, _ := runExec(t, Request{Cmd: "head -c 5; echo; sleep 600 & echo $! > " + pidFile, Stdin: big, TimeoutS: 60})
	killLater(t, readPid(t, pidFile))
	if ev.Stdout != "xxxxx\n" || ev.TimedOut {
		t.Fatalf("exec = %+v", ev)
	}
}

func TestCappedBoundsEncodedSize(t *testing.T) {
	for _, s := range []string{
		strings.Repeat("\x00", 1000), strings.Repeat("<", 1000), strings.Repeat("é", 1000), strings.Repeat("\xff", 1000),
		strings.Repeat("a\"\\\n\u2028", 300),
	} {
		var c capped
		c.limit = 777
		for i := 0; i < len(s); i += 100 {
			c.add(s[i:min(i+100, len(s))])
		}
		body := strings.TrimSuffix(c.sb.String(), truncatedNote)
		b, _ := json.Marshal(body)
		if len(b)-2 > c.limit || !c.truncated {
			t.Errorf("%q...: %d bytes of JSON over a limit of %d (truncated %v)", s[:10], len(b)-2, c.limit, c.truncated)
		}
		if !utf8.ValidString(body) && utf8.ValidString(s) {
			t.Errorf("%q...: a rune was split", s[:10])
		}
	}
}

func TestJSONCostIsAnUpperBound(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 2000; i++ {
		b := make([]byte, r.Intn(40))
		for j := range b {
			b[j] = byte(r.Intn(256))
		}
		s := string(b)
		if i%2 == 0 {
			s = strings.ToValidUTF8(s, "\u2028")
		}
		n, size := encodedPrefix(s, 1<<30)
		enc, _ := json.Marshal(s)
		if n != len(s) || len(enc)-2 > size {
			t.Fatalf("%q: counted %d bytes, encoding/json writes %d", s, size, len(enc)-2)
		}
		if size > 6*len(s) {
			t.Fatalf("%q: counted %d bytes for %d", s, size, len(s))
		}
	}
	if got := capField(strings.Repeat("\x01", 100), 60); got != strings.Repeat("\x01", 10)+truncatedNote {
		t.Errorf("capField = %q", got)
	}
}

func TestParseStat(t *testing.T) {
	st, ok := parseStat(42, []byte("42 (a) b (c)) S 7 42 9 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 123456 0 0"))
	if !ok || st.ppid != 7 || st.pgrp != 42 || st.session != 9 || st.start != 123456 || st.state != 'S' {
		t.Fatalf("parseStat = %+v, %v", st, ok)
	}
	if _, ok := parseStat(1, []byte("1 (x")); ok {
		t.Fatal("parsed a truncated stat")
	}
}

func TestProcTreeAttribution(t *testing.T) {
	tr := newProcTree(t.TempDir(), 100, "") // an empty /proc: every pid looked up there is gone
	p := func(pid, ppid, pgrp, sess int, start uint64) procStat {
		return procStat{pid: pid, ppid: ppid, pgrp: pgrp, session: sess, state: 'S', start: start}
	}
	self := os.Getpid()
	// First scan: the command (100), a child in its group (101), a setsid'd child (102, own session) and its
	// child (103); others (the agent, an unrelated process) are not attributed.
	live := tr.attribute([]procStat{
		p(self, 1, self, self, 1), p(100, self, 100, 8, 10), p(101, 100, 100, 8, 11), p(102, 100, 102, 102, 12),
		p(103, 102, 102, 102, 13), p(200, 1, 200, 200, 5),
	})
	if got := pids(live); got != "100 101 102 103" {
		t.Fatalf("first scan attributed %q", got)
	}
	// Later: 102 has exited and 103 is an orphan (parent 1), still in 102's session; 104 is a new child of the
	// orphan. 101's pid was reused by an unrelated process (another start time, another group): not attributed.
	live = tr.attribute([]procStat{
		p(self, 1, self, self, 1), p(100, self, 100, 8, 10), p(101, 1, 101, 101, 99), p(103, 1, 102, 102, 13),
		p(104, 103, 102, 102, 14), p(105, 1, 105, 105, 15), {pid: 106, ppid: 100, pgrp: 100, session: 8, state: 'Z', start: 16},
	})
	if got := pids(live); got != "100 103 104" {
		t.Fatalf("second scan attributed %q", got)
	}
}

func pids(ps []procStat) string {
	var s []string
	for _, p := range ps {
		s = append(s, strconv.Itoa(p.pid))
	}
	return strings.Join(s, " ")
}

// BenchmarkProcTreeScan measures one scan of this machine's /proc (a sandbox's /proc shows only its family).
func BenchmarkProcTreeScan(b *testing.B) {
	tr := newProcTree("/proc", os.Getpid(), "")
	for i := 0; i < b.N; i++ {
		tr.scan()
	}
}

// A process that is neither a descendant of the command nor in its process group or session (a daemon whose
// double fork the scans missed) is still killed if its environment holds the call's marker; one without it is
// left alone.
func TestProcTreeKillFindsMarkedProcesses(t *testing.T) {
	token := execToken()
	start := func(env string) *exec.Cmd { return startSetsid(t, []string{"PATH=/usr/bin:/bin", env}, "sleep", "100") }
	for _, scanned := range []bool{true, false} { // false: the kill comes before the tracker's first scan
		root := start(ExecIDEnv + "=" + token)
		tree := newProcTree("/proc", root.Process.Pid, token)
		if scanned {
			tree.scan()
		}
		time.Sleep(20 * time.Millisecond) // a later start time than the root's (clock ticks of 10 ms)
		daemon := start(ExecIDEnv + "=" + token)
		other := start(ExecIDEnv + "=" + execToken())
		tree.kill()
		if !goneWithin(root.Process.Pid, 10*time.Second) || !goneWithin(daemon.Process.Pid, 10*time.Second) {
			t.Fatalf("scanned %v: root alive %v, marked daemon alive %v", scanned, alive(root.Process.Pid), alive(daemon.Process.Pid))
		}
		if !alive(other.Process.Pid) {
			t.Fatalf("scanned %v: a process of another call was killed", scanned)
		}
	}
}

// A marked process caught while it shows no environment (an exec chain whose programs start with an empty one
// and end in one that carries the marker, as a process in the middle of execve shows none) is looked at again,
// not left alive; one whose environment stays empty is left alone, and the kill still ends.
func TestProcTreeKillLooksAgainAtEmptyEnvironments(t *testing.T) {
	token := execToken()
	start := func(script string) *exec.Cmd { return startSetsid(t, []string{}, "/bin/sh", "-c", script) }
	root := startSetsid(t, []string{ExecIDEnv + "=" + token}, "/bin/sleep", "100")
	tree := newProcTree("/proc", root.Process.Pid, token)
	time.Sleep(20 * time.Millisecond) // a later start time than the root's (clock ticks of 10 ms)
	// The shell exports PWD unless told not to: env would then run with a PWD and no marker, which a kill is right
	// to take at its word (the chain must go from an empty environment to the marker).
	late := start("unset PWD; /bin/sleep 0.01; exec /usr/bin/env " + ExecIDEnv + "=" + token + " /bin/sleep 100")
	bare := start("exec /bin/sleep 100")
	time.Sleep(2 * time.Millisecond)
	began := time.Now()
	tree.kill()
	took := time.Since(began)
	if !goneWithin(late.Process.Pid, 10*time.Second) {
		t.Fatalf("the process that showed its marker late is alive (kill took %v)", took)
	}
	if !alive(bare.Process.Pid) {
		t.Fatal("a process without the marker was killed")
	}
	if took > 2*time.Second {
		t.Fatalf("kill took %v with an empty environment in sight", took)
	}
}

// startSetsid starts argv in a session of its own with environment env, killed when the test ends.
func startSetsid(t *testing.T, env []string, argv ...string) *exec.Cmd {
	t.Helper()
	c := exec.Command(argv[0], argv[1:]...)
	c.Env = env
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	go c.Wait() //nolint:errcheck
	t.Cleanup(func() { c.Process.Kill() })
	return c
}

// What a job left running writes after its call answered is discarded to the end, by splice or by reads.
func TestDiscardDrainsToTheEnd(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		discard(r)
		close(done)
	}()
	chunk := make([]byte, 1<<20)
	for i := 0; i < 64; i++ { // 64 MiB: blocks unless drained
		if _, err := w.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("discard did not end at EOF")
	}
}

// repl.py's _bounded cuts a string to a JSON size, whatever its characters escape to; _Stream sends output in
// bounded pieces. Runs those parts of the embedded repl.py with the host's python3.
func TestReplOutputIsBounded(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	script := `
import ast, json, sys
src = sys.stdin.read()
tree = ast.parse(src)
keep = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Assign)) and (
    getattr(n, "name", "") in ("_json_len", "_bounded", "_Stream") or
    isinstance(n, ast.Assign) and any(getattr(t, "id", "") in ("_CHUNK", "_FIELD_LIMIT", "_TRUNCATED") for t in n.targets))]
ns = {"json": json}
exec(compile(ast.Module(body=keep, type_ignores=[]), "repl.py", "exec"), ns)
limit = 1000
for s in ["\x01" * 5000, "<" * 5000, "\U0001F600" * 5000, "a" * 999, "\x01" * 166 + "a" * 10, "é\"\\" * 2000]:
    b = ns["_bounded"](s, limit)
    body = b[:-len(ns["_TRUNCATED"])] if b != s else b
    assert s.startswith(body), "not a prefix"
    assert len(json.dumps(body)) - 2 <= limit, (s[:3], len(json.dumps(body)))
    assert b == s or len(json.dumps(s[:len(body) + 1])) - 2 > limit, "cut too short"
sent = []
ns["_send"] = sent.append
ns["_Stream"]("stdout").write("\x01" * 200000)
assert "".join(m["data"] for m in sent) == "\x01" * 200000
assert max(len(json.dumps(m)) for m in sent) <= 12 * ns["_CHUNK"] + 100
print("ok")
`
	c := exec.Command(py, "-c", script)
	c.Stdin = strings.NewReader(replSource)
	out, err := c.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("%v\n%s", err, out)
	}
}

// Output the command wrote before it exited is returned even when the agent's reader runs late (a loaded
// machine): finish waits for what the pipes held at the exit, not only the short grace for late writers. Here
// the reader starts after the grace, while a "background job" keeps the pipes open.
func TestFinishWaitsForOutputQueuedAtExit(t *testing.T) {
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	defer outW.Close() // held open, as a job left running holds them
	defer errW.Close()
	if _, err := outW.Write([]byte("written before the exit\n")); err != nil {
		t.Fatal(err)
	}
	out := &execOutput{emit: func(Event) {}, files: [2]*os.File{outR, errR}}
	out.stdout.limit, out.stderr.limit = outputLimit, outputLimit
	out.pipes.Add(2)
	go func() {
		time.Sleep(3 * outputGrace) // the reader is late
		go out.drain(outR, "stdout", &out.stdout, &out.read[0])
		go out.drain(errR, "stderr", &out.stderr, &out.read[1])
	}()
	if stdout, _ := out.finish(); stdout != "written before the exit\n" {
		t.Fatalf("stdout %q: output queued at the exit was lost", stdout)
	}
}
