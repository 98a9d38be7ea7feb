package integration

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/internal/testserver"
)

// Sandboxes of one fork family share a PID namespace; the seccomp supervisor keeps each one's processes out of
// reach of the others, even for root.
func TestForkFamilyMembersCannotTouchEachOther(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	parent := create(t, s, nil)
	value(t, s, parent, "import os\nalive = 'parent'")
	kids, err := s.Client.Fork(ctx, parent, 2)
	if err != nil {
		t.Fatal(err)
	}
	a, b := kids[0], kids[1]
	// Pids (in the family's PID namespace) of the parent's and b's interpreters, as a sees them.
	ppid := strings.TrimSpace(value(t, s, parent, "str(os.getpid())"))
	bpid := strings.TrimSpace(value(t, s, b, "str(os.getpid())"))
	apid := strings.Trim(strings.TrimSpace(value(t, s, a, "str(os.getpid())")), "'")
	ppid, bpid = strings.Trim(ppid, "'"), strings.Trim(bpid, "'")

	// They are not listed in a's /proc, nor killable, traceable or enterable.
	r := sh(t, s, a, fmt.Sprintf(`kill -9 %[1]s 2>&1; echo "kill parent: $?"
kill -9 %[2]s 2>&1; echo "kill sibling: $?"
ls /proc | grep -x -e %[1]s -e %[2]s; echo "listed: $?"
kill -9 %[3]s; echo "kill own interpreter: $?"
python3 - <<'PY'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for pid in (%[1]s, %[2]s):
    r = libc.ptrace(16, pid, 0, 0)  # PTRACE_ATTACH
    print("ptrace", pid, r, os.strerror(ctypes.get_errno()))
    try:
        fd = os.open("/proc/%%d/ns/net" %% pid, os.O_RDONLY)
        r = libc.setns(fd, 0)
        print("setns", pid, r, os.strerror(ctypes.get_errno()))
    except OSError as e:  # not listed in this sandbox's /proc: there is nothing to open
        print("setns", pid, "open refused:", e.strerror)
    try:
        os.pidfd_open(pid)
        print("pidfd_open", pid, "allowed")
    except OSError as e:
        print("pidfd_open", pid, e.strerror)
PY
sleep 100 & kill -9 $! && echo "own kill ok"
`, ppid, bpid, apid))
	t.Logf("in a:\n%s%s", r.Stdout, r.Stderr)
	out := r.Stdout + r.Stderr
	for _, want := range []string{"kill parent: 1", "kill sibling: 1", "listed: 1", "kill own interpreter: 0", "own kill ok"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q", want)
		}
	}
	if strings.Count(out, "Operation not permitted")+strings.Count(out, "No such file or directory") < 6 || strings.Contains(out, "pidfd_open "+ppid+" allowed") {
		t.Errorf("ptrace/setns/pidfd_open not all refused:\n%s", out)
	}
	// Everyone is still alive and intact.
	if v := value(t, s, parent, "alive"); v != "'parent'" {
		t.Fatalf("parent interpreter: %s", v)
	}
	if v := value(t, s, b, "alive"); v != "'parent'" {
		t.Fatalf("sibling interpreter: %s", v)
	}
	// a killed its own interpreter: the next call says so, then a fresh one runs.
	if ex := run(t, s, a, "1 + 1"); ex.Error == nil || ex.Error.Name != "InterpreterDied" {
		t.Fatalf("a after killing its interpreter: %+v", ex)
	}
	if v := value(t, s, a, "1 + 1"); v != "2" {
		t.Fatalf("a after killing its interpreter: %s", v)
	}
}
