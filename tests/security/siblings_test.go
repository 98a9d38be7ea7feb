package security

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/internal/testserver"
)

// The interpreter of every member of a fork family is out of reach of every other member's code, parent, child
// and sibling alike, from a shell or from the other's interpreter: its memory, environment, descriptors and files
// through /proc, its signals, ptrace and process_vm. (What still crosses within a family is listed in
// docs/security.md: the processes a sandbox starts with exec are visible to its family and, sharing the family's
// uid, open to its members' /proc access; the numbers of an interpreter's open descriptors can be listed.)
func TestFamilyInterpretersOutOfEachOthersReach(t *testing.T) {
	s := testserver.Start(t)
	parent := s.Create(t, nil)
	s.Value(t, parent, "import os\nsecret = 'parent secret'")
	kids := s.Fork(t, parent, 2)
	members := append([]string{parent}, kids...)
	pids := map[string]string{}
	for _, id := range members {
		pids[id] = strings.Trim(s.Value(t, id, "str(os.getpid())"), "'")
	}
	probe := `
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
def attempt(what, f):
    try:
        f()
        print("REACHED", what)
    except OSError as e:
        print("refused", what, e.errno)
for pid in [int(p) for p in sys.argv[1:]]:
    for name in ("mem", "environ", "auxv", "fd/3", "root/etc/hostname", "cwd/."):
        attempt("open %d %s" % (pid, name), lambda: os.close(os.open("/proc/%d/%s" % (pid, name), os.O_RDONLY)))
    attempt("signal %d" % pid, lambda: os.kill(pid, signal.SIGSTOP))
    def ptrace(pid=pid):
        if libc.ptrace(16, pid, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "ptrace")
    attempt("ptrace %d" % pid, ptrace)
`
	s.Sh(t, parent, "cat > /tmp/probe.py <<'PY'\n"+probe+"PY")
	for _, attacker := range members {
		var targets []string
		for _, victim := range members {
			if victim != attacker {
				targets = append(targets, pids[victim])
			}
		}
		if attacker != parent {
			s.Sh(t, attacker, "cat > /tmp/probe.py <<'PY'\n"+probe+"PY")
		}
		fromShell := s.Sh(t, attacker, "python3 /tmp/probe.py "+strings.Join(targets, " "))
		fromRepl := s.Run(t, attacker, fmt.Sprintf("import sys, runpy; sys.argv = ['probe'] + %q.split(); runpy.run_path('/tmp/probe.py')", strings.Join(targets, " ")))
		for name, out := range map[string]string{"shell": fromShell.Stdout + fromShell.Stderr, "interpreter": fromRepl.Stdout + fromRepl.Stderr} {
			if strings.Contains(out, "REACHED") || strings.Count(out, "refused") != 8*len(targets) {
				t.Errorf("%s's %s reached another member's interpreter:\n%s", attacker, name, out)
			}
		}
	}
	for _, id := range members {
		if v := s.Value(t, id, "secret"); v != "'parent secret'" {
			t.Errorf("%s: state after the attempts: %s", id, v)
		}
	}
}
