package security

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// killEverything is what hostile (or careless) code runs to take its sandbox down: every way of signalling
// every process it can see, ramify's own included, one exec each (a pkill -f may take its own shell with it).
var killEverything = []string{
	"kill -9 -1",
	"kill -9 1",
	"pkill -9 -f ramify",
	"pkill -9 -f __agent",
	`python3 -c '
import os
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) != os.getpid():
        try:
            os.kill(int(p), 9)
        except OSError:
            pass
'`,
}

// A sandbox survives its own code trying to kill everything in sight: its agent (and the family init) are out of
// reach, only the sandbox's own processes die, and it answers the next calls with its files intact. The same for
// a fork child, whose parent and sibling are untouched. reboot(2) is refused (in a PID namespace it would kill the
// family's init, and with it every sandbox of the family).
func TestSandboxSurvivesKillingEverything(t *testing.T) {
	s := testserver.Start(t)
	parent := s.Create(t, nil)
	s.Sh(t, parent, "echo kept > /root/file.txt")
	s.Value(t, parent, "x = 'parent state'")
	kids := s.Fork(t, parent, 2)
	for _, id := range []string{parent, kids[0]} {
		s.Value(t, id, "import subprocess; bg = subprocess.Popen(['sleep', '1000'])") // a user process: it does go
		for _, attack := range killEverything {
			r, err := s.Client.Exec(testserver.Ctx(t), id, client.ExecRequest{Cmd: attack})
			if err != nil {
				t.Fatalf("%s: %q: %v", id, attack, err)
			}
			t.Logf("%s: %q: exit %d %q", id, attack, r.ExitCode, r.Stderr)
		}
		reboot := s.Sh(t, id, `python3 -c 'import ctypes; print(ctypes.CDLL(None, use_errno=True).reboot(0x01234567), ctypes.get_errno())'`)
		if reboot.Stdout != "-1 1\n" { // EPERM
			t.Errorf("%s: reboot(2) was not refused with EPERM: %+v", id, reboot)
		}
		// The sandbox still answers: exec at once, run_code after reporting the interpreter it lost.
		if out := s.Sh(t, id, "cat /root/file.txt; pgrep -c -x sleep || true").Stdout; out != "kept\n0\n" {
			t.Errorf("%s after kill -9 -1: files or processes: %q", id, out)
		}
		if ex := s.Run(t, id, "1"); ex.Error != nil && ex.Error.Name != "InterpreterDied" {
			t.Errorf("%s: run_code after the kill: %+v", id, ex.Error)
		}
		if v := s.Value(t, id, "2 + 2"); v != "4" {
			t.Errorf("%s: run_code after the kill: %q", id, v)
		}
		if info, err := s.Client.Get(testserver.Ctx(t), id); err != nil || info.Status != "running" {
			t.Errorf("%s: status after the kill: %+v %v", id, info, err)
		}
	}
	// The sibling that did nothing kept its interpreter, state and all.
	if v := s.Value(t, kids[1], "x"); v != "'parent state'" {
		t.Errorf("sibling lost its state: %s", v)
	}
}

// ramifyPids returns the pids of ramify's processes next to sandbox id's code, as that code numbers them: the
// family init (PID 1) and the sandbox's agent (the parent of every command it runs). Sandbox code cannot list
// them (its /proc shows only its own sandbox's processes), so the agent is found as a command's parent; that it
// is not listed is checked here too.
func ramifyPids(t *testing.T, s *testserver.Server, id string) []string {
	t.Helper()
	out := s.Sh(t, id, `echo $PPID; ls -d /proc/[0-9]* | sed 's,/proc/,,'`).Stdout
	lines := strings.Fields(out)
	if len(lines) < 2 {
		t.Fatalf("no parent pid or process list: %q", out)
	}
	agentPid, listed := lines[0], lines[1:]
	for _, p := range listed {
		if p == "1" || p == agentPid {
			t.Errorf("%s: ramify's process %s is listed in the sandbox's /proc: %v", id, p, listed)
		}
	}
	return []string{"1", agentPid}
}

// Nothing in a sandbox, not even its root, can read or write the memory, descriptors, environment, files or
// executable of ramify's own processes, trace them, take their descriptors, or signal them.
func TestRamifyProcessesOutOfReach(t *testing.T) {
	s := testserver.Start(t)
	parent := s.Create(t, nil)
	kids := s.Fork(t, parent, 1)
	// Each member tries its own agent, the family init and the other member's agent.
	parentPids, kidPids := ramifyPids(t, s, parent), ramifyPids(t, s, kids[0])
	for _, id := range []string{parent, kids[0]} {
		pids := append(append([]string{}, parentPids...), kidPids[1])
		probe := probePrelude + fmt.Sprintf(`
for pid in %s:
    for name, flags in (("mem", os.O_RDWR), ("mem", os.O_RDONLY), ("environ", os.O_RDONLY), ("auxv", os.O_RDONLY)):
        attempt("open /proc/%%d/%%s" %% (pid, name), lambda: os.open("/proc/%%d/%%s" %% (pid, name), flags))
    for link in ("root", "cwd", "exe", "fd/0", "fd/1", "fd/2", "fd/3", "fd/4"):
        attempt("readlink /proc/%%d/%%s" %% (pid, link), lambda: os.readlink("/proc/%%d/%%s" %% (pid, link)))
        attempt("open /proc/%%d/%%s" %% (pid, link), lambda: os.open("/proc/%%d/%%s" %% (pid, link), os.O_RDONLY))
    attempt("listdir /proc/%%d/fd" %% pid, lambda: os.listdir("/proc/%%d/fd" %% pid))
    attempt("listdir /proc/%%d/root/" %% pid, lambda: os.listdir("/proc/%%d/root/" %% pid))
    attempt("signal 0 %%d" %% pid, lambda: os.kill(pid, 0))
    attempt("SIGSTOP %%d" %% pid, lambda: os.kill(pid, signal.SIGSTOP))
    attempt("pidfd_open %%d" %% pid, lambda: os.pidfd_open(pid))
    attempt("ptrace %%d" %% pid, lambda: ptrace(pid))
    attempt("process_vm_readv %%d" %% pid, lambda: vm_read(pid))
`, "["+strings.Join(pids, ", ")+"]")
		r := s.Sh(t, id, "python3 - <<'PY'\n"+probe+"PY")
		out := r.Stdout + r.Stderr
		if strings.Contains(out, "REACHED") || strings.Count(out, "refused") < 20*len(pids) {
			t.Errorf("%s: sandbox code reached ramify's processes %v:\n%s", id, pids, out)
		}
		// The fork token is nowhere on a command line.
		if cmdlines := s.Sh(t, id, `cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' ' '`).Stdout; strings.Contains(cmdlines, "token") || strings.Contains(cmdlines, "{") {
			t.Errorf("%s: a command line carries a config or token: %q", id, cmdlines)
		}
		// And everything still works, fork included.
		if v := s.Value(t, id, "21 * 2"); v != "42" {
			t.Errorf("%s: run_code after the attempts: %s", id, v)
		}
	}
	if more := s.Fork(t, kids[0], 1); len(more) != 1 {
		t.Fatal("fork after the attempts")
	}
}

// Sandbox code holds the reduced capability set (UserCaps) with no_new_privs; the interpreter additionally holds
// CAP_SYS_ADMIN (for a fork child's setns) but cannot pass it on to what it starts.
func TestSandboxCapabilities(t *testing.T) {
	s := testserver.Start(t)
	id := s.Create(t, nil)
	var want uint64
	for _, c := range agent.UserCaps {
		want |= 1 << uint(c)
	}
	field := func(status, name string) uint64 {
		for _, line := range strings.Split(status, "\n") {
			if v, ok := strings.CutPrefix(line, name+":"); ok {
				n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				if err == nil {
					return n
				}
			}
		}
		t.Fatalf("no %s in %q", name, status)
		return 0
	}
	execStatus := s.Sh(t, id, "cat /proc/self/status").Stdout
	subStatus := s.Run(t, id, "import subprocess; print(subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout)").Stdout
	replStatus := s.Run(t, id, "print(open('/proc/self/status').read())").Stdout
	for name, st := range map[string]string{"exec": execStatus, "interpreter's subprocess": subStatus} {
		if eff, bnd := field(st, "CapEff"), field(st, "CapBnd"); eff != want || bnd != want {
			t.Errorf("%s: CapEff %x CapBnd %x, want %x", name, eff, bnd, want)
		}
		if !strings.Contains(st, "NoNewPrivs:\t1") {
			t.Errorf("%s: no_new_privs is not set", name)
		}
	}
	if eff, bnd := field(replStatus, "CapEff"), field(replStatus, "CapBnd"); eff != want|1<<21 || bnd != want {
		t.Errorf("interpreter: CapEff %x CapBnd %x, want %x and %x", eff, bnd, want|1<<21, want)
	}
}

// A descriptor the server inherited from whatever launched it (not close-on-exec) reaches no sandbox process.
func TestInheritedDescriptorsDoNotReachSandboxes(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "launcher-secret.txt")
	if err := os.WriteFile(secret, []byte("host secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(secret)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := testserver.StartInheriting(t, []*os.File{f})
	id := s.Create(t, nil)
	kid := s.Fork(t, id, 1)[0]
	for _, sb := range []string{id, kid} {
		out := s.Sh(t, sb, `for p in /proc/[0-9]*; do ls -l $p/fd/ 2>/dev/null; done | grep -c launcher-secret || true`).Stdout
		inRepl := s.Value(t, sb, "import os\ndef link(f):\n    try:\n        return os.readlink('/proc/self/fd/' + f)\n    except OSError:\n        return ''\n[link(f) for f in os.listdir('/proc/self/fd')]")
		if strings.TrimSpace(out) != "0" || strings.Contains(inRepl, "launcher-secret") {
			t.Errorf("%s: a sandbox process holds the server's inherited descriptor: exec %q, interpreter %s", sb, out, inRepl)
		}
	}
}

// What ramify takes away from sandbox code must not break ordinary process management inside the sandbox:
// signals by pid, pkill, pidfds, kill of the process group, and tracing one's own child.
func TestOwnProcessesStayManageable(t *testing.T) {
	s := testserver.Start(t)
	parent := s.Create(t, nil)
	kid := s.Fork(t, parent, 1)[0]
	for _, id := range []string{parent, kid} {
		r := s.Sh(t, id, `sleep 1001 & kill -TERM $! && wait $! ; echo "kill: $?"
sleep 1002 >/dev/null 2>&1 & sleep 0.1; pkill -x sleep; echo "pkill: $?"
python3 - <<'PY'
import os, signal, subprocess, ctypes
p = subprocess.Popen(["sleep", "1003"])
fd = os.pidfd_open(p.pid)
signal.pidfd_send_signal(fd, signal.SIGKILL)
print("pidfd:", p.wait())
libc = ctypes.CDLL(None, use_errno=True)
q = subprocess.Popen(["sleep", "1004"])
print("ptrace own child:", libc.ptrace(16, q.pid, 0, 0), ctypes.get_errno())
q.kill()
PY`)
		out := r.Stdout + r.Stderr
		for _, want := range []string{"kill: 143", "pkill: 0", "pidfd: -9", "ptrace own child: 0 0"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: missing %q in:\n%s", id, want, out)
			}
		}
	}
}

// The agent's socket is reachable from inside its sandbox (an abstract socket in the sandbox's network
// namespace), but only the server may call it: sandbox code connecting to it is refused every operation but a
// forked interpreter's token-guarded attach, whatever uid it takes.
func TestAgentSocketRefusesSandboxCode(t *testing.T) {
	s := testserver.Start(t)
	id := s.Create(t, nil)
	r := s.Sh(t, id, `python3 - <<'PY'
import json, os, socket
for uid in (0, 65534):
    pid = os.fork()
    if pid == 0:
        os.setuid(uid)
        for op in ({"op": "ping"}, {"op": "exec", "cmd": "echo AGENT-RAN-IT"}, {"op": "start", "env": {"X": "1"}}):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect("\0ramify-agent")
            s.sendall((json.dumps(op) + "\n").encode())
            print(uid, op["op"], s.recv(4096).decode().strip())
            s.close()
        os._exit(0)
    os.waitpid(pid, 0)
PY`)
	out := r.Stdout + r.Stderr
	t.Logf("%s", out)
	if strings.Count(out, "only the ramify server may call the agent") != 6 || strings.Contains(out, "AGENT-RAN-IT") {
		t.Errorf("sandbox code drove its agent:\n%s", out)
	}
	if v := s.Value(t, id, "1 + 1"); v != "2" {
		t.Errorf("the server's own calls: %q", v)
	}
}

// grabTasks is code that keeps its sandbox's tasks limit full: whenever a task ends, it forks another (a fork
// bomb that never lets go, or a process pool sized past max_procs).
const grabTasks = `import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
    except OSError:
        time.sleep(0.0005)
`

// A sandbox survives code that fills its tasks limit (max_procs) and keeps it full: its agent, whose threads
// count against the same limit, never needs a new one (the Go runtime ends a process that cannot start a
// thread), so the calls made meanwhile are answered, the interpreter keeps its state, and once the code is
// killed the sandbox works as before. Before, the agent died as the exec that started such code waited for its
// command (a thread blocked in waitid) and the sandbox was restarted, its interpreter's state lost. The same for
// a fork child, whose agent was started ahead as a spare. The limit is the sandbox's own: its agent's threads do
// not count against max_procs.
func TestSandboxSurvivesItsFullTasksLimit(t *testing.T) {
	s := testserver.Start(t)
	parent := s.Create(t, &client.CreateRequest{MaxProcs: 16})
	// max_procs is what the sandbox's code gets, the interpreter included: 15 more processes start.
	if out := s.Sh(t, parent, "for i in $(seq 14); do sleep 30 & done; sleep 0.2; pgrep -c -x sleep; pkill -x sleep").Stdout; out != "14\n" {
		t.Fatalf("14 processes beside the interpreter and the shell under max_procs 16: %q", out)
	}
	// usage.pids counts what max_procs limits: the interpreter, not the agent's threads.
	if info, err := s.Client.Get(testserver.Ctx(t), parent); err != nil || info.Usage == nil || info.Usage.Pids != 1 {
		t.Errorf("usage of an idle sandbox: %+v, %v; want 1 task (its interpreter)", info.Usage, err)
	}
	s.Value(t, parent, "x = 'kept'")
	kid := s.Fork(t, parent, 1)[0]
	for _, id := range []string{parent, kid} {
		if _, err := s.Client.WriteFile(testserver.Ctx(t), id, "/root/grab.py", strings.NewReader(grabTasks), 0o644); err != nil {
			t.Fatal(err)
		}
		// The exec that starts the grabber waits for its shell while the limit fills: what killed the agent.
		if r := s.Sh(t, id, "setsid python3 /root/grab.py >/dev/null 2>&1 & sleep 1; echo started"); r.Stdout != "started\n" && r.ExitCode == 0 {
			t.Fatalf("%s: starting the grabber: %+v", id, r)
		}
		// Full once the grabber has taken every task (a moment on a loaded machine): an exec cannot start.
		var last *client.ExecResult
		waitFor(t, 30*time.Second, func() bool {
			last = s.Sh(t, id, "echo no room")
			return last.ExitCode != 0
		})
		if !strings.Contains(last.Stderr, "tasks limit, max_procs, is full") {
			t.Fatalf("%s: an exec with the tasks limit full: %+v, want a message that says so", id, last)
		}
		// Calls of every kind at once while the limit stays full.
		var wg sync.WaitGroup
		errs := make(chan error, 24)
		for i := range 24 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := testserver.Ctx(t)
				var err error
				switch i % 3 {
				case 0:
					var ex *client.Execution
					if ex, err = s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: "import time; time.sleep(0.2); x"}); err == nil && (ex.Error != nil || ex.Value == nil || *ex.Value != "'kept'") {
						err = fmt.Errorf("run_code: %+v %+v", ex, ex.Error)
					}
				case 1:
					_, err = s.Client.Exec(ctx, id, client.ExecRequest{Cmd: "true"}) // fails to start: no room
				case 2:
					p := fmt.Sprintf("/root/f%d", i)
					if _, err = s.Client.WriteFile(ctx, id, p, strings.NewReader(strings.Repeat("x", 1<<20)), 0o644); err == nil {
						var rc io.ReadCloser
						if rc, err = s.Client.ReadFile(ctx, id, p); err == nil {
							_, err = io.Copy(io.Discard, rc)
							rc.Close()
						}
					}
				}
				if err != nil {
					errs <- fmt.Errorf("call %d: %w", i, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("%s with its tasks limit full: %v", id, err)
		}
		// A fork needs a task per child in the parent for a moment. Room is made for them on top of the limit,
		// but the grabber races the interpreter for it: the fork either gets it, or is refused as a conflict (the
		// sandbox's state), not an error of ramify's, and leaves nothing behind.
		if kids, err := s.Client.Fork(testserver.Ctx(t), id, 2); err == nil {
			t.Logf("%s: the fork got the room made for its copies before the grabber", id)
			for _, k := range kids {
				s.Client.Delete(testserver.Ctx(t), k) //nolint:errcheck // checked by the server's clean-up
			}
		} else if ae, ok := err.(*client.APIError); !ok || ae.StatusCode != 409 || !strings.Contains(ae.Message, "tasks limit (max_procs) is full") {
			t.Errorf("%s: fork with its tasks limit full: %v, want a 409 that says so", id, err)
		}
		// The interpreter was never restarted: its state is there, and it can clear the sandbox of the grabber.
		if v := s.Value(t, id, "import os, signal; os.kill(-1, signal.SIGKILL); x"); v != "'kept'" {
			t.Fatalf("%s: the interpreter's state after its tasks limit was full: %q", id, v)
		}
		waitFor(t, 10*time.Second, func() bool { return s.Sh(t, id, "echo room").Stdout == "room\n" })
		if info, err := s.Client.Get(testserver.Ctx(t), id); err != nil || info.Status != "running" || info.Error != "" {
			t.Fatalf("%s: after its tasks limit was full: %+v %v", id, info, err)
		}
	}
	// The copies of a fork are the parent's tasks until moved, on top of its max_procs: 32 children of a sandbox
	// whose max_procs is 16.
	kids := s.Fork(t, parent, 32)
	if v := s.Value(t, kids[31], "x"); v != "'kept'" {
		t.Errorf("the 32nd child of a max_procs 16 parent: %q", v)
	}
	if strings.Contains(s.Log(), "sandbox restarted") {
		t.Errorf("a sandbox was restarted:\n%s", s.Log())
	}
}
