package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/testserver"
)

// Children made ahead of a fork (internal/sandbox/ahead.go): a sandbox that forked and then sits idle is forked
// again in the background, and its next fork takes those children if the sandbox did not change meanwhile. These
// tests change it in every way code inside it can, without a call through the API as well as with one, and check
// that a fork's children always start from the parent's state at the fork.

// forkRaw forks id into n children and reports whether they were made ahead.
func forkRaw(t *testing.T, s *testserver.Server, id string, n int) ([]string, bool) {
	t.Helper()
	code, body := raw(t, s, "POST", "/v1/sandboxes/"+id+"/fork", s.Key, fmt.Appendf(nil, `{"n": %d}`, n))
	if code != 200 {
		t.Fatalf("fork %s: %d %v", id, code, body)
	}
	var kids []string
	for _, k := range body["children"].([]any) {
		kids = append(kids, k.(string))
	}
	ahead, _ := body["made_ahead"].(bool)
	return kids, ahead
}

// aheadMetric reads ramify_fork_ahead_ready, or ramify_fork_ahead_children_total for outcome.
func aheadMetric(t *testing.T, s *testserver.Server, outcome string) float64 {
	t.Helper()
	fams := scrapeMetrics(t, s.URL+"/metrics", s.Key)
	if outcome == "" {
		return fams["ramify_fork_ahead_ready"].GetMetric()[0].GetGauge().GetValue()
	}
	return metric(fams, "ramify_fork_ahead_children_total", "outcome", outcome).GetCounter().GetValue()
}

// waitAheadReady waits until n children made ahead are ready and returns when they were first seen.
func waitAheadReady(t *testing.T, s *testserver.Server, n int, within time.Duration) time.Time {
	t.Helper()
	waitUntil(t, within, func() bool { return aheadMetric(t, s, "") >= float64(n) }, func() string {
		return fmt.Sprintf("no %d children made ahead within %v (made %v, used %v, dropped %v)", n, within,
			aheadMetric(t, s, "made"), aheadMetric(t, s, "used"), aheadMetric(t, s, "dropped"))
	})
	return time.Now()
}

func deleteAll(t *testing.T, s *testserver.Server, ids []string) {
	t.Helper()
	for _, id := range ids {
		if err := s.Client.Delete(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
}

func TestForkAheadChildrenStartFromTheParentsState(t *testing.T) {
	s := testserver.Start(t)
	p := create(t, s, nil)
	value(t, s, p, "import numpy as np\narr = np.arange(10)\nx = 1\n1")
	sh(t, s, p, "echo one > /root/f")
	kids, ahead := forkRaw(t, s, p, 2)
	if ahead {
		t.Fatal("a sandbox's first fork was made ahead")
	}
	deleteAll(t, s, kids)

	// Idle and unchanged: the next fork takes the children made ahead, which are whole sandboxes of their own.
	waitAheadReady(t, s, 2, 60*time.Second)
	before := time.Now()
	kids, ahead = forkRaw(t, s, p, 2)
	if !ahead {
		t.Fatal("an idle parent's fork did not take its children made ahead")
	}
	pinfo, _ := s.Client.Get(ctxT(t), p)
	for i, k := range kids {
		info, err := s.Client.Get(ctxT(t), k)
		if err != nil || info.Status != "running" || info.ParentID != p || info.IP == pinfo.IP ||
			info.CreatedAt.Before(before.Add(-time.Second)) {
			t.Fatalf("child %d: %+v %v (fork began %v)", i, info, err, before)
		}
		// Its first run, as a child made at the call would have it: the parent's last value and count go on (the
		// warm-up run each child made ahead had left no trace).
		if ex := run(t, s, k, "(_, x, int(arr.sum()))"); ex.Value == nil || *ex.Value != "(1, 1, 45)" || ex.ExecutionCount != 2 {
			t.Fatalf("child %d's first run: %+v", i, ex)
		}
		// Its fd-level output (a subprocess's) is its runs', each run's own (the warm-up ran through the same
		// path, ending its output as a run does).
		for j := range 2 {
			if ex := run(t, s, k, fmt.Sprintf("import os; os.system('echo fd-%d')", j)); ex.Stdout != fmt.Sprintf("fd-%d\n", j) {
				t.Fatalf("child %d's run %d: fd-level output %q", i, j, ex.Stdout)
			}
		}
		if r := sh(t, s, k, "cat /root/f; hostname"); r.Stdout != "one\n"+info.Hostname+"\n" {
			t.Fatalf("child %d: %q", i, r.Stdout)
		}
		value(t, s, k, fmt.Sprintf("x = %d; open('/root/g', 'w').write('%d'); 1", 10+i, i))
	}
	for i, k := range kids {
		if v := value(t, s, k, "x"); v != fmt.Sprint(10+i) {
			t.Fatalf("child %d sees its sibling's x: %s", i, v)
		}
		if r := sh(t, s, k, "cat /root/g"); r.Stdout != fmt.Sprint(i) {
			t.Fatalf("child %d sees its sibling's file: %q", i, r.Stdout)
		}
	}
	if v := value(t, s, p, "x"); v != "1" {
		t.Fatalf("parent x = %s", v)
	}
	if r := sh(t, s, p, "ls /root"); strings.Contains(r.Stdout, "g") {
		t.Fatalf("parent sees a child's file: %q", r.Stdout)
	}
	deleteAll(t, s, kids)

	// Changed through calls: run_code, exec, a file written through the API. Each drops the children made ahead
	// before it runs, and the fork right after it makes fresh ones.
	for i, change := range []func(){
		func() { value(t, s, p, "x = 2\n1") },
		func() { sh(t, s, p, "echo two > /root/f") },
		func() {
			if _, err := s.Client.WriteFile(ctxT(t), p, "/root/f", strings.NewReader("three\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		},
	} {
		waitAheadReady(t, s, 2, 60*time.Second)
		change()
		if n := aheadMetric(t, s, ""); n != 0 {
			t.Fatalf("change %d: %v children made ahead still ready", i, n)
		}
		kids, ahead = forkRaw(t, s, p, 2)
		if ahead {
			t.Fatalf("change %d: the fork took children made before it", i)
		}
		want := []string{"(2, 'one\\n')", "(2, 'two\\n')", "(2, 'three\\n')"}[i]
		for _, k := range kids {
			if v := value(t, s, k, "(x, open('/root/f').read())"); v != want {
				t.Fatalf("change %d: child sees %s, want %s", i, v, want)
			}
		}
		deleteAll(t, s, kids)
	}
}

// Code in the parent that changes it later, on its own, with no call through the API: a thread of its
// interpreter, and a process it left running in the background.
func TestForkAheadNotUsedWhenTheParentChangedOnItsOwn(t *testing.T) {
	s := testserver.Start(t)
	p := create(t, s, nil)
	kids, _ := forkRaw(t, s, p, 2)
	deleteAll(t, s, kids)

	// A thread that sleeps (no CPU: the children can be made ahead meanwhile), then changes a variable and a file.
	const delay = 8 * time.Second
	began := time.Now()
	value(t, s, p, fmt.Sprintf(`import threading, time
def later():
    time.sleep(%d)
    globals()["y"] = "late"
    open("/root/late", "w").write("late")
threading.Thread(target=later, daemon=True).start()
1`, int(delay.Seconds())))
	ready := waitAheadReady(t, s, 2, delay-2*time.Second)
	if ready.Sub(began) > delay-time.Second {
		t.Fatalf("children made ahead only %v after the thread began: too late to test", ready.Sub(began))
	}
	time.Sleep(time.Until(began.Add(delay + 2*time.Second)))
	dropped := aheadMetric(t, s, "dropped")
	kids, ahead := forkRaw(t, s, p, 2)
	if ahead {
		t.Fatal("the fork took children made before the parent's thread changed it")
	}
	for _, k := range kids {
		if v := value(t, s, k, "(y, open('/root/late').read())"); v != "('late', 'late')" {
			t.Fatalf("child sees %s", v)
		}
	}
	if d := aheadMetric(t, s, "dropped"); d != dropped+2 {
		t.Fatalf("dropped %v -> %v, want the two children made ahead dropped at the fork", dropped, d)
	}
	deleteAll(t, s, kids)

	// A background process: while it runs, no children are made ahead; what it wrote is in the next fork.
	kids = noneMadeWhile(t, s, p, "a background process ran", func() {
		sh(t, s, p, "(sleep 3; echo bg > /root/bg) >/dev/null 2>&1 &")
	})
	for _, k := range kids {
		if r := sh(t, s, k, "cat /root/bg"); r.Stdout != "bg\n" {
			t.Fatalf("child: /root/bg = %q", r.Stdout)
		}
	}
	deleteAll(t, s, kids)

	// A Linux AIO context: a read submitted with io_submit on an O_DIRECT file lands in the interpreter's memory
	// later, with no process of the sandbox running. While the interpreter holds one, no children are made ahead.
	deleteAll(t, s, noneMadeWhile(t, s, p, "the interpreter held an AIO context", func() {
		value(t, s, p, `import ctypes
_aio_ctx = ctypes.c_ulong(0)
ctypes.CDLL(None, use_errno=True).syscall(206, 8, ctypes.byref(_aio_ctx))`) // io_setup
	}))
}

// noneMadeWhile waits for p's children made ahead, has start begin something in p (a call, which drops them)
// that must keep p from getting new ones while it lasts, checks that none are made in the 5 s after it, and
// returns the children of a fork of 2 then, which must have been made at the call.
func noneMadeWhile(t *testing.T, s *testserver.Server, p, what string, start func()) []string {
	t.Helper()
	waitAheadReady(t, s, 2, 60*time.Second)
	start()
	made := aheadMetric(t, s, "made")
	time.Sleep(5 * time.Second)
	if m := aheadMetric(t, s, "made"); m != made {
		t.Fatalf("children made ahead while %s (made %v -> %v)", what, made, m)
	}
	kids, ahead := forkRaw(t, s, p, 2)
	if ahead {
		t.Fatalf("the fork took children made ahead while %s", what)
	}
	return kids
}

// TestForkAheadNotForSessionsWithForkHooks: at-fork handlers run on every fork, so a fork made ahead of its call
// would run them before anyone asked for a fork. A session that registered one that runs in the parent (here a
// fork counter) or that its own code registered for children gets no children made ahead: its count shows only
// the forks asked for. A library's handler for children (a module under site-packages) does not stop them.
func TestForkAheadNotForSessionsWithForkHooks(t *testing.T) {
	s := testserver.Start(t)
	for _, tc := range []struct{ name, code string }{
		{"a handler run in the parent", "import os\nforks = 0\ndef _count():\n    global forks\n    forks += 1\nos.register_at_fork(before=_count)\n1"},
		{"the session's handler for children", "import os\ndef _hello():\n    pass\nos.register_at_fork(after_in_child=_hello)\n1"},
	} {
		p := create(t, s, nil)
		value(t, s, p, tc.code)
		for round := range 2 {
			kids, ahead := forkRaw(t, s, p, 2)
			if ahead {
				t.Fatalf("%s: round %d: the fork took children made ahead", tc.name, round)
			}
			deleteAll(t, s, kids)
			time.Sleep(1500 * time.Millisecond) // children would be made ahead meanwhile
		}
		if tc.name == "a handler run in the parent" {
			// Once per child: a fork of n forks the interpreter n times.
			if v := value(t, s, p, "forks"); v != "4" {
				t.Fatalf("%s: the parent's handler ran %s times for 2 forks of 2 children", tc.name, v)
			}
		}
		if err := s.Client.Delete(ctxT(t), p); err != nil {
			t.Fatal(err)
		}
	}
	if m := aheadMetric(t, s, "made"); m != 0 {
		t.Fatalf("%v children made ahead for sessions with fork handlers", m)
	}
	// A library's handler for its children, as numpy's and most libraries' are: children made ahead as usual.
	p := create(t, s, nil)
	value(t, s, p, "import os, sys\nos.makedirs('/root/lib/site-packages', exist_ok=True)\n"+
		"open('/root/lib/site-packages/forklib.py', 'w').write('import os\\nchildren = 0\\ndef _reset():\\n    global children\\n    children += 1\\nos.register_at_fork(after_in_child=_reset)\\n')\n"+
		"sys.path.insert(0, '/root/lib/site-packages')\nimport forklib\n1")
	kids, _ := forkRaw(t, s, p, 2)
	deleteAll(t, s, kids)
	waitAheadReady(t, s, 2, 60*time.Second)
	kids, ahead := forkRaw(t, s, p, 2)
	if !ahead {
		t.Fatal("a library's handler for children kept the fork from taking children made ahead")
	}
	if v := value(t, s, kids[0], "forklib.children"); v != "1" {
		t.Fatalf("the library's handler ran %s times in a child, want 1", v)
	}
}

// TestInterpreterKilledBetweenCallsIsReported: an interpreter killed between calls (here by a command in its
// sandbox; out of memory alike) is reported by the next run, which does not run its code ("its state is lost"),
// even when the server's own work found it dead first: the check before children are made ahead of a fork
// (the sandbox forked before and sat idle), or a fork asked for, which fails. A fresh interpreter runs the run
// after. Before, the next run silently ran in a fresh interpreter with the session gone.
func TestInterpreterKilledBetweenCallsIsReported(t *testing.T) {
	s := testserver.Start(t)
	p := create(t, s, nil)
	value(t, s, p, "x = 41; 1")
	kids, _ := forkRaw(t, s, p, 1)
	deleteAll(t, s, kids)
	for _, tc := range []struct {
		name  string
		found func()
	}{
		{"found by the check before children are made ahead", func() { time.Sleep(1500 * time.Millisecond) }},
		{"found by a fork", func() {
			code, body := raw(t, s, "POST", "/v1/sandboxes/"+p+"/fork", s.Key, []byte(`{"n": 1}`))
			if code == 200 {
				t.Fatalf("a fork of a sandbox whose interpreter was killed succeeded: %v", body)
			}
		}},
	} {
		pid := value(t, s, p, "import os; os.getpid()")
		if r := sh(t, s, p, "kill -9 "+pid); r.ExitCode != 0 {
			t.Fatalf("%s: kill: %+v", tc.name, r)
		}
		tc.found()
		ex := run(t, s, p, "x")
		if ex.Error == nil || ex.Error.Name != "InterpreterDied" || !strings.Contains(ex.Error.Value, "state is lost") {
			t.Fatalf("%s: the run after the interpreter was killed: %+v / %+v", tc.name, ex, ex.Error)
		}
		if v := value(t, s, p, "x = 41; 1"); v != "1" {
			t.Fatalf("%s: the run after: %s", tc.name, v)
		}
	}
}

// Children made ahead have no record: a server killed while a sandbox has some restarts without them (its reclaim
// removes their processes, cgroups, veths and layers), and one stopped cleanly takes them down as it stops.
func TestForkAheadChildrenLeaveNothingBehind(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0")
	p := create(t, s, nil)
	value(t, s, p, "x = 41; 1")
	for i, stop := range []func(){s.Kill, s.Stop} {
		kids, _ := forkRaw(t, s, p, 3)
		deleteAll(t, s, kids)
		waitAheadReady(t, s, 3, 60*time.Second)
		stop()
		if inv := s.Inventory(); i == 1 && !slices.Equal(inv.Layers, []string{p}) {
			t.Fatalf("after a clean stop: layers %v, want only the parent's", inv.Layers)
		}
		s.Restart()
		checkNoLeftovers(t, s, expect{})
		if got := value(t, s, p, "x + 1"); got != "42" {
			t.Fatalf("after the restart: x + 1 = %s", got)
		}
	}
}

// Children made ahead whose interpreter or agent was killed since (from the host: the OOM killer, an admin) are
// not handed to the fork: it makes its children at the call instead, and each starts from the parent's state.
// Before, the fork answered made_ahead with children whose first run_code said InterpreterDied (or whose agent
// did not answer), until the health watcher's next look.
func TestForkAheadChildrenKilledAreNotHandedOut(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0")
	p := create(t, s, nil)
	value(t, s, p, "x = 41; 1")
	for _, victim := range []string{"python3", "agent"} {
		kids, _ := forkRaw(t, s, p, 2)
		deleteAll(t, s, kids)
		waitAheadReady(t, s, 2, 60*time.Second)
		killed := 0
		var pids []int
		for _, cg := range s.Inventory().Cgroups {
			if !strings.HasPrefix(cg, "sbx_") || cg == p {
				continue
			}
			procs, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids/ramify", s.Owner(), cg, "cgroup.procs"))
			if err != nil {
				t.Skipf("cgroup v1 only: %v", err)
			}
			for _, f := range strings.Fields(string(procs)) {
				pid, _ := strconv.Atoi(f)
				comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
				if (strings.TrimSpace(string(comm)) == "python3") == (victim == "python3") {
					syscall.Kill(pid, syscall.SIGKILL)
					pids = append(pids, pid)
					killed++
				}
			}
		}
		if killed != 2 {
			t.Fatalf("%s: killed %d processes of children made ahead, want 2", victim, killed)
		}
		// Dead, not only signalled (on a loaded machine a SIGKILLed process runs on for a moment): a fork racing
		// a kill that has not taken effect yet cannot see it.
		waitUntil(t, 10*time.Second, func() bool { return len(deadOrGone(pids)) == len(pids) }, func() string {
			return fmt.Sprintf("killed processes %v still running", pids)
		})
		kids, ahead := forkRaw(t, s, p, 2)
		for _, k := range kids {
			if got := value(t, s, k, "x + 1"); got != "42" {
				t.Errorf("%s killed in the children made ahead: a fork child (made_ahead %v) has x + 1 = %s", victim, ahead, got)
			}
		}
		deleteAll(t, s, kids)
	}
}

// deadOrGone returns those of pids whose process has exited (a zombie, or reaped).
func deadOrGone(pids []int) []int {
	var out []int
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if i := strings.LastIndexByte(string(b), ')'); err != nil || i > 0 && i+2 < len(b) && b[i+2] == 'Z' {
			out = append(out, pid)
		}
	}
	return out
}
