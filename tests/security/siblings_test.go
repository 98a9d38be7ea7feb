package security

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// probePrelude starts every attack probe run inside a sandbox: attempt(what, f) prints "REACHED what <result>"
// or "refused what errno"; ptrace(pid) and vm_read(pid) raise OSError when the kernel refuses them.
const probePrelude = `
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
def attempt(what, f):
    try:
        r = f()
        print("REACHED", what, repr(r)[:80])
    except OSError as e:
        print("refused", what, e.errno)
def ptrace(pid):
    if libc.ptrace(16, pid, 0, 0) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), "ptrace")
def vm_read(pid):
    buf = ctypes.create_string_buffer(8)
    local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
    remote = (ctypes.c_void_p * 2)(0x400000, 8)
    if libc.process_vm_readv(pid, local, 1, remote, 1, 0) < 0:
        raise OSError(ctypes.get_errno(), "process_vm_readv")
`

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
	probe := probePrelude + `
for pid in [int(p) for p in sys.argv[1:]]:
    for name in ("mem", "environ", "auxv", "fd/3", "root/etc/hostname", "cwd/."):
        attempt("open %d %s" % (pid, name), lambda: os.close(os.open("/proc/%d/%s" % (pid, name), os.O_RDONLY)))
    attempt("signal %d" % pid, lambda: os.kill(pid, signal.SIGSTOP))
    attempt("ptrace %d" % pid, lambda: ptrace(pid))
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

// The processes a member starts, with exec or from its interpreter (subprocess), are out of every other member's
// reach as well: not listed in its /proc, their memory, environment, descriptors, files and executable closed,
// no ptrace, process_vm or signal, and no member can take another's group (which would give it their
// credentials). Within a sandbox, everything keeps working: its own processes are listed and open to it.
func TestFamilyProcessesOutOfEachOthersReach(t *testing.T) {
	s := testserver.Start(t)
	parent := s.Create(t, nil)
	kids := s.Fork(t, parent, 2)
	members := append([]string{parent}, kids...)
	type victim struct {
		pids []string
		gid  string
	}
	victims := map[string]victim{}
	for i, id := range members {
		// One process from exec (left running in the background), one from the interpreter.
		bg := strings.TrimSpace(s.Sh(t, id, fmt.Sprintf("SECRET=env-of-%d sleep %d >/dev/null 2>&1 & echo $!", i, 1000+i)).Stdout)
		sub := strings.Trim(s.Value(t, id, fmt.Sprintf("import subprocess\np = subprocess.Popen(['sleep', '%d'])\nstr(p.pid)", 2000+i)), "'")
		gid := strings.TrimSpace(s.Sh(t, id, "id -g").Stdout)
		victims[id] = victim{pids: []string{bg, sub}, gid: gid}
		// Its own processes: listed, open, and its /proc shows nothing else of the family.
		own := s.Sh(t, id, fmt.Sprintf(`ls /proc | grep -qx %s && ls /proc | grep -qx %s && tr '\0' '\n' < /proc/%s/environ | grep -x SECRET=env-of-%d && ps -eo args --no-headers`, bg, sub, bg, i))
		if own.ExitCode != 0 || !strings.Contains(own.Stdout, fmt.Sprintf("sleep %d", 1000+i)) || !strings.Contains(own.Stdout, fmt.Sprintf("sleep %d", 2000+i)) {
			t.Fatalf("%s: its own processes are not all listed and open to it: %+v", id, own)
		}
		for j := range members {
			if j != i && (strings.Contains(own.Stdout, fmt.Sprintf("sleep %d", 1000+j)) || strings.Contains(own.Stdout, fmt.Sprintf("sleep %d", 2000+j))) {
				t.Errorf("%s: ps shows another member's process:\n%s", id, own.Stdout)
			}
		}
		if sub := s.Value(t, id, fmt.Sprintf("open('/proc/%s/cmdline').read()", sub)); !strings.Contains(sub, "sleep") {
			t.Errorf("%s: the interpreter cannot read its own subprocess's /proc: %s", id, sub)
		}
		// Scheduling of its own processes (and of itself) works.
		if r := s.Sh(t, id, fmt.Sprintf("renice -n 5 -p %s $$ && taskset -p 1 %s && nice -n 3 true", bg, bg)); r.ExitCode != 0 {
			t.Errorf("%s: scheduling its own processes: %+v", id, r)
		}
	}
	for i, a := range members {
		for _, b := range members[i+1:] {
			if victims[a].gid == victims[b].gid {
				t.Fatalf("members %s and %s share group %s", a, b, victims[a].gid)
			}
		}
	}
	probe := probePrelude + `
def visible(pid):
    if str(pid) in os.listdir("/proc"):
        return
    raise OSError(2, "not listed")
groups, pids = sys.argv[1].split(","), [int(p) for p in sys.argv[2:]]
for g in groups:
    attempt("setgid %s" % g, lambda: os.setgid(int(g)))
    attempt("setresgid %s" % g, lambda: os.setresgid(-1, -1, int(g)))
    attempt("setfsgid %s" % g, lambda: (_ for _ in ()).throw(OSError(1, "setfsgid")) if libc.setfsgid(int(g)) != os.getgid() or libc.setfsgid(-1) != os.getgid() else None)
for pid in pids:
    attempt("list %d" % pid, lambda: visible(pid))
    for name in ("mem", "environ", "auxv", "fd/0", "root/etc/hostname", "cwd/."):
        attempt("open %d %s" % (pid, name), lambda: os.close(os.open("/proc/%d/%s" % (pid, name), os.O_RDONLY)))
    attempt("readlink %d exe" % pid, lambda: os.readlink("/proc/%d/exe" % pid))
    attempt("signal %d" % pid, lambda: os.kill(pid, signal.SIGSTOP))
    attempt("setpriority %d" % pid, lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))
    attempt("sched_setaffinity %d" % pid, lambda: os.sched_setaffinity(pid, {0}))
    attempt("ptrace %d" % pid, lambda: ptrace(pid))
    attempt("process_vm_readv %d" % pid, lambda: vm_read(pid))
`
	// Priorities of a process group or of every process of the uid would reach the siblings: refused.
	if r := s.Sh(t, parent, "renice -n 5 -u root; echo user:$?; renice -n 5 -g $$; echo group:$?"); !strings.Contains(r.Stdout, "user:1") || !strings.Contains(r.Stdout, "group:1") {
		t.Errorf("renice of a user or a process group: %+v", r)
	}
	for _, attacker := range members {
		var groups, targets []string
		for _, v := range members {
			if v != attacker {
				groups = append(groups, victims[v].gid)
				targets = append(targets, victims[v].pids...)
			}
		}
		s.Sh(t, attacker, "cat > /tmp/probe.py <<'PY'\n"+probe+"PY")
		args := strings.Join(groups, ",") + " " + strings.Join(targets, " ")
		fromShell := s.Sh(t, attacker, "python3 /tmp/probe.py "+args)
		fromRepl := s.Run(t, attacker, fmt.Sprintf("import sys, runpy; sys.argv = ['probe'] + %q.split(); runpy.run_path('/tmp/probe.py')", args))
		want := 3*len(groups) + 13*len(targets)
		for name, out := range map[string]string{"shell": fromShell.Stdout + fromShell.Stderr, "interpreter": fromRepl.Stdout + fromRepl.Stderr} {
			if strings.Contains(out, "REACHED") || strings.Count(out, "refused") != want {
				t.Errorf("%s's %s reached another member's processes (want %d refusals):\n%s", attacker, name, want, out)
			}
		}
	}
	// Every victim is untouched and still running.
	for i, id := range members {
		v := victims[id]
		if r := s.Sh(t, id, fmt.Sprintf("grep State /proc/%s/status /proc/%s/status", v.pids[0], v.pids[1])); r.ExitCode != 0 || strings.Contains(r.Stdout, "stopped") || strings.Count(r.Stdout, "State") != 2 {
			t.Errorf("member %d (%s): its processes after the attempts: %+v", i, id, r)
		}
	}
}

// forkHeldPrelude is what a parent holds when it forks, every way a process can hold a kernel object beyond its
// own memory and its files' paths: descriptors of a directory (also O_PATH), a deleted file, a memfd, a UDP and a
// TCP socket, a pipe, a file as its stdin; a MAP_SHARED mapping of a file, anonymous shared memory and a SysV shared memory segment.
const forkHeldPrelude = `
import ctypes, mmap, os, socket, stat, tempfile, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
os.makedirs("/root/d", exist_ok=True)
with open("/root/pfile", "wb") as f:
    f.write(b"parent".ljust(4096, b"."))
dfd = os.open("/root/d", os.O_RDONLY | os.O_DIRECTORY)
pathfd = os.open("/root/d", os.O_PATH)
pf = open("/root/pfile", "r+b")
fmap = mmap.mmap(pf.fileno(), 4096, mmap.MAP_SHARED)
amap = mmap.mmap(-1, 4096, mmap.MAP_SHARED)
amap[:6] = b"parent"
tmp = tempfile.TemporaryFile()
tmp.write(b"parent")
tmp.flush()
mfd = os.memfd_create("held")
os.write(mfd, b"parent")
shm = libc.shmat(libc.shmget(0, 4096, 0o1600), None, 0)
ctypes.memmove(shm, b"parent", 6)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
tcp = socket.socket()
rpipe, wpipe = os.pipe()
with open("/root/stdin", "wb") as f:
    f.write(b"parent")
os.dup2(os.open("/root/stdin", os.O_RDWR), 0)  # a file of the parent's as the interpreter's stdin
# A thread opening sockets as fast as it can while the fork runs: a descriptor opened between the moment the
# parent lists its descriptors and its fork must not reach a child either.
opened, busy = [], True  # (socket, its inode): the child's own later sockets may take a closed one's number
def open_sockets():
    while busy:
        sk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        opened.append((sk, os.fstat(sk.fileno()).st_ino))
        if len(opened) > 200:
            opened.pop(0)[0].close()
threading.Thread(target=open_sockets, daemon=True).start()
"held"
`

// forkHeldAttack writes through everything the parent held, from a child, and reports each attempt.
const forkHeldAttack = `
out = []
def attempt(what, f):
    try:
        f()
        out.append(what + ":wrote")
    except OSError as e:
        out.append(what + ":" + os.strerror(e.errno))
attempt("dirfd", lambda: os.close(os.open("evil", os.O_CREAT | os.O_WRONLY, dir_fd=dfd)))
attempt("pathfd", lambda: os.close(os.open("/proc/self/fd/%d/evil2" % pathfd, os.O_CREAT | os.O_WRONLY)))
attempt("fmap", lambda: fmap.__setitem__(slice(0, 5), b"CHILD"))
attempt("amap", lambda: amap.__setitem__(slice(0, 5), b"CHILD"))
attempt("tmp", lambda: (tmp.seek(0), tmp.write(b"CHILD"), tmp.flush()))
attempt("memfd", lambda: os.pwrite(mfd, b"CHILD", 0))
attempt("shm", lambda: ctypes.memmove(shm, b"CHILD", 5))
attempt("pipe", lambda: os.write(wpipe, b"CHILD"))
attempt("stdin", lambda: os.pwrite(0, b"CHILD", 0))
attempt("udp", lambda: udp.sendto(b"x", ("10.255.255.53", 53)))
attempt("tcp", lambda: tcp.connect(("10.255.255.53", 53)))
def is_parents(fd, ino):
    try:
        st = os.fstat(fd)
        return stat.S_ISSOCK(st.st_mode) and st.st_ino == ino
    except OSError:
        return False  # closed in the child (opened by the parent's thread as it forked)
leaked = [sk.fileno() for sk, ino in list(opened) if sk.fileno() >= 0 and is_parents(sk.fileno(), ino)]
" ".join(out) + " sockets-left:%d" % len(leaked)
`

// forkHeldState is what a member sees of everything the parent held.
const forkHeldState = `
import select
busy = False
str([os.path.exists("/root/d/evil") or os.path.exists("/root/d/evil2"), bytes(fmap[:6]), bytes(amap[:6]),
     (tmp.seek(0), tmp.read(6))[1], os.pread(mfd, 6, 0), ctypes.string_at(shm, 6),
     bool(select.select([rpipe], [], [], 0)[0]) and os.read(rpipe, 5) == b"CHILD", os.pread(0, 6, 0)])
`

// A fork child shares nothing with its parent or its siblings but the state it was forked from: what the parent
// held open or mapped (directories, deleted files, memfds, sockets, pipes, shared mappings of files, anonymous
// and SysV shared memory), even a socket another thread opened as the fork ran, becomes the child's own copy or
// is closed for it, so that writing through it from a child changes nothing in the parent or a sibling, and the
// parent's sockets do not carry a child's traffic past its own egress policy (here: none).
func TestForkChildHoldsNothingOfItsParent(t *testing.T) {
	s := testserver.Start(t)
	parent := s.Create(t, nil)
	if v := s.Value(t, parent, forkHeldPrelude); v != "'held'" {
		t.Fatalf("parent set-up: %s", v)
	}
	none := []string{}
	kids, err := s.Client.ForkWith(testserver.Ctx(t), parent, client.ForkRequest{N: 2, Egress: &none})
	if err != nil {
		t.Fatal(err)
	}
	got := s.Value(t, kids[0], forkHeldAttack)
	for _, want := range []string{"dirfd:wrote", "pathfd:wrote", "fmap:wrote", "amap:wrote", "tmp:wrote", "memfd:wrote",
		"shm:wrote", "stdin:wrote", "udp:Socket operation on non-socket", "tcp:Socket operation on non-socket", "sockets-left:0"} {
		if !strings.Contains(got, want) {
			t.Errorf("child's attempts: want %q in %s", want, got)
		}
	}
	untouched := `"[False, b'parent', b'parent', b'parent', b'parent', b'parent', False, b'parent']"`
	for _, id := range []string{parent, kids[1]} {
		if v := s.Value(t, id, forkHeldState); v != untouched {
			t.Errorf("%s after its child/sibling wrote through what the parent held: %s, want %s", id, v, untouched)
		}
	}
	// The child wrote into its own copies (the pipe is closed for it: its writes went nowhere).
	if v := s.Value(t, kids[0], forkHeldState); v != `"[True, b'CHILDt', b'CHILDt', b'CHILDt', b'CHILDt', b'CHILDt', False, b'CHILDt']"` {
		t.Errorf("the child's own copies: %s", v)
	}
}

// A parent holding what a child cannot make its own (here a 64 GiB shared mapping, reserved but never touched:
// the child's copy is refused) cannot fork: the fork fails at once, not after its children's start timeout
// (30 s), says why, and leaves the parent as it was.
func TestForkOfWhatCannotBeCopiedFailsAtOnce(t *testing.T) {
	s := testserver.Start(t)
	parent := s.Create(t, nil)
	s.Value(t, parent, "import mmap\nbig = mmap.mmap(-1, 64 << 30, flags=mmap.MAP_SHARED | 0x4000)  # MAP_NORESERVE\nbig[:2] = b'ok'")
	ctx, cancel := context.WithTimeout(testserver.Ctx(t), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := s.Client.Fork(ctx, parent, 1)
	took := time.Since(start)
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 409 || !strings.Contains(apiErr.Message, "exited before it attached") {
		t.Fatalf("fork after %s: %v, want a 409 saying the child's interpreter exited", took, err)
	}
	if took > 10*time.Second {
		t.Errorf("the fork failed after %s: it waited for its child's start timeout", took)
	}
	if v := s.Value(t, parent, "bytes(big[:2])"); v != "b'ok'" {
		t.Errorf("parent after the failed fork: %s", v)
	}
	all, err := s.Client.List(testserver.Ctx(t), client.ListOptions{})
	if err != nil || len(all) != 1 {
		t.Errorf("sandboxes after the failed fork: %d (%v), want the parent only", len(all), err)
	}
}
