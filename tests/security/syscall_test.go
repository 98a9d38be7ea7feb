package security

import (
	"os/exec"
	"sort"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// probeScript defines probes(), which tries every syscall the default seccomp profile closes, the way hostile
// code would (ctypes, raw syscall numbers of x86_64, and a few through the i386 entry point, int 0x80), and
// returns "name=result" lines: "ok" or the errno's name. It has side effects when a call succeeds (a new
// namespace, an unmounted mask): run it in a throwaway process.
const probeScript = `
import ctypes, errno, os, socket, subprocess

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]

def arg(x):
    if x is None or isinstance(x, (bytes, ctypes.Array)):
        return x
    return ctypes.c_long(x)

def errname(e):
    return errno.errorcode.get(e, str(e))

def sc(nr, *a):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[arg(x) for x in a])
    return errname(ctypes.get_errno()) if r < 0 else "ok"

def clone(flags):
    # A raw clone without CLONE_VM is a fork: the child leaves at once.
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(56), ctypes.c_long(flags | 17), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
    if r == 0:
        os._exit(0)
    if r < 0:
        return errname(ctypes.get_errno())
    os.waitpid(r, 0)
    return "ok"

def sock(*a):
    try:
        socket.socket(*a).close()
        return "ok"
    except OSError as e:
        return errname(e.errno)

# i386 syscalls from this 64-bit process: int 0x80 with eax=nr, ebx, ecx, edx, in memory below 4 GiB.
mem = libc.mmap(None, 4096, 7, 0x2 | 0x20 | 0x40, -1, 0)  # RWX, MAP_PRIVATE|MAP_ANONYMOUS|MAP_32BIT
code = bytes([0x53, 0x48, 0x89, 0xf8, 0x48, 0x89, 0xf3, 0x49, 0x89, 0xd0, 0x48, 0x89, 0xca, 0x4c, 0x89, 0xc1,
              0xcd, 0x80, 0x5b, 0xc3])  # push rbx; mov rax,rdi; mov rbx,rsi; mov r8,rdx; mov rdx,rcx; mov rcx,r8; int 0x80; pop rbx; ret
ctypes.memmove(mem, code, len(code))
int80 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long)(mem)
def i386_entry():
    # Some kernels (a paravirtualized guest, ia32_emulation=0) give 64-bit processes no int 0x80 entry: it raises
    # SIGSEGV, on the host as in a sandbox. Tried in a child, so that the probes go on.
    pid = os.fork()
    if pid == 0:
        int80(20, 0, 0, 0)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == 11)
I386 = i386_entry()
def sc32(nr, a=0, b=0, c=0):
    if not I386:
        return "no-i386-entry"
    r = int80(nr, a, b, c)
    return errname(-r) if -4096 < r < 0 else "ok"

def probes():
    res = {}
    buf = ctypes.create_string_buffer(512)
    perf = ctypes.create_string_buffer(128)
    perf[0] = 1; perf[4] = 128; perf[8] = 1; perf[40] = 0x20 | 0x40  # software task clock, exclude kernel and hv
    res["add_key"] = sc(248, b"user", b"k", b"v", 1, -2)
    res["request_key"] = sc(249, b"user", b"nokey", None, -2)
    res["keyctl"] = sc(250, 0, -2, 1)
    res["bpf"] = sc(321, 0, buf, 64)
    res["perf_event_open"] = sc(298, perf, 0, -1, -1, 0)
    res["userfaultfd"] = sc(323, 1)
    res["io_uring_setup"] = sc(425, 1, ctypes.create_string_buffer(120))
    res["io_uring_enter"] = sc(426, -1, 0, 0, 0, None, 0)
    res["io_uring_register"] = sc(427, -1, 0, None, 0)
    # First the probes that need a working process (subprocess), then those with side effects should they succeed.
    p = subprocess.Popen(["sleep", "100"])
    lim = (ctypes.c_uint64 * 2)(16, 16)
    res["prlimit_other_set"] = sc(302, p.pid, 7, lim, None)
    res["prlimit_other_get"] = sc(302, p.pid, 7, None, lim)
    cur = (ctypes.c_uint64 * 2)()
    sc(302, 0, 7, None, cur)
    res["prlimit_self_set"] = sc(302, 0, 7, cur, None)
    p.kill(); p.wait()
    res["i386_getpid"] = sc32(20)
    res["i386_keyctl"] = sc32(288, 0, -2 & 0xffffffff, 1)
    res["i386_unshare_user"] = sc32(310, 0x10000000)
    res["i386_mount"] = sc32(21, 0, 0, 0)
    args = ctypes.cast(mem + 256, ctypes.POINTER(ctypes.c_uint32))
    args[0], args[1], args[2] = 17, 3, 0x0300  # AF_PACKET, SOCK_RAW, ETH_P_ALL
    res["i386_socketcall_packet"] = sc32(102, 1, mem + 256)
    for name, flag in [("user", 0x10000000), ("mnt", 0x20000), ("uts", 0x04000000), ("ipc", 0x08000000),
                       ("net", 0x40000000), ("pid", 0x20000000), ("cgroup", 0x02000000), ("time", 0x80)]:
        res["unshare_" + name] = sc(272, flag)
        if name != "time":
            res["clone_" + name] = clone(flag)
    res["clone3"] = sc(435, buf, 88)
    res["mount_tmpfs"] = sc(165, b"none", b"/tmp", b"tmpfs", 0, None)
    res["remount_proc_sys_rw"] = sc(165, None, b"/proc/sys", None, 0x20 | 0x1000 | 0x2 | 0x4 | 0x8, None)
    res["umount_mask"] = sc(166, b"/proc/keys", 2)
    res["umount_proc_sys"] = sc(166, b"/proc/sys", 2)
    res["pivot_root"] = sc(155, b"/", b"/")
    res["open_tree"] = sc(428, -100, b"/", 1)
    res["move_mount"] = sc(429, -1, b"", -100, b"/tmp", 4)
    res["fsopen"] = sc(430, b"tmpfs", 0)
    res["fsconfig"] = sc(431, -1, 0, None, None, 0)
    res["fsmount"] = sc(432, -1, 0, 0)
    res["fspick"] = sc(433, -100, b"/", 0)
    res["mount_setattr"] = sc(442, -100, b"/", 0, buf, 32)
    res["kexec_load"] = sc(246, 0, 0, None, 0)
    res["kexec_file_load"] = sc(320, -1, -1, 0, b"", 0)
    res["init_module"] = sc(175, buf, 0, b"")
    res["finit_module"] = sc(313, -1, b"", 0)
    res["delete_module"] = sc(176, b"nosuchmodule", 0)
    res["clock_settime"] = sc(227, 0, None)
    res["clock_adjtime"] = sc(305, 0, buf)
    res["settimeofday"] = sc(164, None, None)
    res["adjtimex"] = sc(159, buf)
    res["reboot"] = sc(169, 0, 0, 0, None)
    res["swapon"] = sc(167, b"/nonexistent", 0)
    res["swapoff"] = sc(168, b"/nonexistent")
    res["acct"] = sc(163, None)
    res["quotactl"] = sc(179, 0, None, 0, None)
    res["open_by_handle_at"] = sc(304, -100, buf, 0)
    res["lookup_dcookie"] = sc(212, 0, buf, 64)
    res["nfsservctl"] = sc(180, 0, None, None)
    res["vhangup"] = sc(153)
    res["iopl"] = sc(172, 3)
    res["ioperm"] = sc(173, 0x80, 1, 1)
    res["sethostname"] = sc(170, b"x", 1)
    res["syslog"] = sc(103, 3, buf, 64)
    res["personality_no_randomize"] = sc(135, 0x0040000)
    res["personality_query"] = sc(135, 0xffffffff)
    res["x32_getpid"] = sc(0x40000000 | 39)
    res["socket_packet"] = sock(17, socket.SOCK_RAW, 0x0300)
    res["socket_inet_sock_packet"] = sock(socket.AF_INET, 10, 0x0300)
    res["socket_vsock"] = sock(40, socket.SOCK_STREAM)
    res["socket_xdp"] = sock(44, socket.SOCK_RAW)
    res["socket_raw4"] = sock(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    res["socket_raw6"] = sock(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    res["socket_sctp"] = sock(socket.AF_INET, socket.SOCK_STREAM, 132)
    res["socket_netlink_netfilter"] = sock(socket.AF_NETLINK, socket.SOCK_RAW, 12)
    res["socket_netlink_route"] = sock(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    res["socket_tcp"] = sock(socket.AF_INET, socket.SOCK_STREAM)
    res["socket_udp6"] = sock(socket.AF_INET6, socket.SOCK_DGRAM)
    res["socket_unix"] = sock(socket.AF_UNIX, socket.SOCK_STREAM)
    return "\n".join("%s=%s" % kv for kv in sorted(res.items()))
`

// wantProbes is what every probe must answer from inside a sandbox.
var wantProbes = map[string]string{
	"clone3": "ENOSYS", "x32_getpid": "ENOSYS",
	"personality_query": "ok", "socket_netlink_route": "ok", "socket_tcp": "ok", "socket_udp6": "ok",
	"socket_unix": "ok", "prlimit_other_get": "ok", "prlimit_self_set": "ok", "i386_getpid": "ok",
}

func init() {
	for _, name := range []string{
		"add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
		"io_uring_enter", "io_uring_register", "mount_tmpfs", "remount_proc_sys_rw", "umount_mask",
		"umount_proc_sys", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
		"mount_setattr", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
		"clock_settime", "clock_adjtime", "settimeofday", "adjtimex", "reboot", "swapon", "swapoff", "acct",
		"quotactl", "open_by_handle_at", "lookup_dcookie", "nfsservctl", "vhangup", "iopl", "ioperm",
		"sethostname", "syslog", "personality_no_randomize", "socket_packet", "socket_inet_sock_packet",
		"socket_vsock", "socket_xdp", "socket_raw4", "socket_raw6", "socket_sctp", "socket_netlink_netfilter",
		"prlimit_other_set", "i386_keyctl", "i386_unshare_user", "i386_mount", "i386_socketcall_packet",
	} {
		wantProbes[name] = "EPERM"
	}
	for _, ns := range []string{"user", "mnt", "uts", "ipc", "net", "pid", "cgroup", "time"} {
		wantProbes["unshare_"+ns] = "EPERM"
		if ns != "time" {
			wantProbes["clone_"+ns] = "EPERM"
		}
	}
}

// inForkedInterpreter runs probes() in an os.fork() of the interpreter: it keeps the interpreter's capabilities
// (CAP_SYS_ADMIN among them, for a fork child's setns) and its seccomp filter, and its side effects, should a
// call succeed, stay out of the interpreter.
const inForkedInterpreter = probeScript + `
import os as _os
_r, _w = _os.pipe()
_pid = _os.fork()
if _pid == 0:
    _os.close(_r)
    try:
        _out = probes()
    except BaseException as _e:
        _out = "error=%r" % (_e,)
    _os.write(_w, _out.encode())
    _os._exit(0)
_os.close(_w)
_data = b""
while True:
    _b = _os.read(_r, 65536)
    if not _b:
        break
    _data += _b
_os.close(_r)
_os.waitpid(_pid, 0)
print(_data.decode())
`

// expectedProbes is wantProbes for this host: where its kernel gives a 64-bit process no i386 system call entry
// (int 0x80; some paravirtualized guests), as the probes' own check finds when run on the host, a sandbox must not
// have it either, and the i386 probes answer "no-i386-entry".
func expectedProbes(t *testing.T) map[string]string {
	t.Helper()
	out, err := exec.Command("python3", "-c", probeScript+"\nprint(I386)").CombinedOutput()
	if err != nil {
		t.Fatalf("i386 entry check on the host: %v\n%s", err, out)
	}
	if strings.TrimSpace(string(out)) == "True" {
		return wantProbes
	}
	want := map[string]string{}
	for k, v := range wantProbes {
		if strings.HasPrefix(k, "i386_") {
			v = "no-i386-entry"
		}
		want[k] = v
	}
	return want
}

// checkProbes compares the probes' output out, from where, with want (expectedProbes).
func checkProbes(t *testing.T, want map[string]string, where, out string) {
	t.Helper()
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			got[k] = v
		}
	}
	var bad []string
	for k, w := range want {
		if got[k] != w {
			bad = append(bad, k+"="+got[k]+" (want "+w+")")
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("%s: %d probes answered wrong:\n  %s\noutput:\n%s", where, len(bad), strings.Join(bad, "\n  "), out)
	}
}

// Every syscall the default profile closes fails from inside a sandbox, from an exec'd command and from the
// interpreter (which also holds CAP_SYS_ADMIN, so for mount, umount, unshare and the mount API the profile is
// the only defence), in a fresh sandbox and in a fork child, through the x86_64 and the i386 entry points. The
// masked paths stay masked after the attempts.
func TestSyscallPolicyClosesKernelSurface(t *testing.T) {
	s := testserver.Start(t)
	parent := s.Create(t, nil)
	kid := s.Fork(t, parent, 1)[0]
	want := expectedProbes(t) // once: the host's check starts a python3 of its own
	for _, id := range []string{parent, kid} {
		r, err := s.Client.Exec(testserver.Ctx(t), id, client.ExecRequest{Argv: []string{"python3", "-c", probeScript + "\nprint(probes())"}})
		if err != nil {
			t.Fatal(err)
		}
		if r.ExitCode != 0 {
			t.Fatalf("%s: exec probes: exit %d: %s", id, r.ExitCode, r.Stderr)
		}
		checkProbes(t, want, id+" exec", r.Stdout)
		ex := s.Run(t, id, inForkedInterpreter)
		if ex.Error != nil {
			t.Fatalf("%s: run_code probes: %s: %s\n%s", id, ex.Error.Name, ex.Error.Value, ex.Error.Traceback)
		}
		checkProbes(t, want, id+" interpreter", ex.Stdout)
		if out := s.Sh(t, id, "stat -c %F /proc/keys").Stdout; out != "character special file\n" {
			t.Errorf("%s: masks gone after the attempts: %q", id, out)
		}
	}
	// The sandbox and the family still work: run_code, fork from the child.
	if v := s.Value(t, kid, "1 + 1"); v != "2" {
		t.Errorf("fork child after the probes: %q", v)
	}
	if more := s.Fork(t, kid, 1); len(more) != 1 {
		t.Fatal("fork of the child after the probes")
	}
}

// What runc masks and makes read-only is masked and read-only in a sandbox (exec'd commands and a fork child),
// and /sys is there, read-only.
func TestKernelPathsMaskedAndReadOnly(t *testing.T) {
	s := testserver.Start(t)
	parent := s.Create(t, nil)
	kid := s.Fork(t, parent, 1)[0]
	// Masked files are /dev/null (a character device, empty), masked directories an empty tmpfs; paths this
	// kernel lacks (here, without CONFIG_PROC_KCORE and CONFIG_MAGIC_SYSRQ: /proc/kcore, /proc/sysrq-trigger)
	// are not listed.
	script := `
for f in /proc/kcore /proc/keys /proc/timer_list /proc/latency_stats /proc/sched_debug /proc/interrupts; do
  [ -e $f ] && echo "$f $(stat -c %F $f) $(head -c 4096 $f 2>/dev/null | wc -c)"
done
for d in /proc/acpi /proc/scsi /proc/asound /sys/firmware /sys/devices/virtual/powercap /sys/fs/btrfs /sys/block /sys/class/block /sys/dev/block /sys/devices/virtual/block; do
  [ -e $d ] && echo "$d $(stat -f -c %T $d) $(ls -A $d | wc -l)"
done
for f in /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv4/ping_group_range /proc/sysrq-trigger; do
  [ -e $f ] && if (echo 0 > $f) 2>/dev/null; then echo "write:$f writable"; else echo "write:$f refused"; fi
done
grep -E ' /(proc/sys|proc/sysrq-trigger|proc/bus|proc/fs|proc/irq|sys) ' /proc/self/mounts | awk '{print "mount:" $2, substr($4, 1, 2)}'
cat /sys/class/net/lo/address
touch /sys/x 2>/dev/null && echo "sys writable" || echo "sys refused"
# What the masks are for: every sandbox's disk usage (btrfs quota groups), the host's paths (a loop device's
# backing file) and its disks' I/O counters, wherever they are in /sys.
find /sys -name backing_file -o -path '*/qgroups/*' -name referenced -o -path '*/block/*' -name stat 2>/dev/null | sed 's/^/leak:/'
`
	for _, id := range []string{parent, kid} {
		r := s.Sh(t, id, script)
		out := r.Stdout
		lines := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if k, v, ok := strings.Cut(l, " "); ok {
				lines[k] = v
			}
		}
		// The overlay's options in mountinfo name its directories by descriptor, not by the host's paths.
		if mi := s.Sh(t, id, "cat /proc/self/mountinfo").Stdout; strings.Contains(mi, s.DataDir) || strings.Contains(mi, "/images/") {
			t.Errorf("%s: /proc/self/mountinfo shows the host's paths:\n%s", id, mi)
		}
		if strings.Contains(out, "leak:") {
			t.Errorf("%s: /sys shows the host's block devices or file systems:\n%s", id, out)
		}
		for _, p := range []string{"/proc/keys", "/proc/timer_list", "/proc/interrupts", "/sys/firmware", "/sys/fs/btrfs", "/sys/block"} {
			if _, ok := lines[p]; !ok {
				t.Errorf("%s: %s missing:\n%s", id, p, out)
			}
		}
		for k, v := range lines {
			if strings.HasPrefix(k, "/") && v != "character special file 0" && v != "tmpfs 0" {
				t.Errorf("%s: %s is not masked: %q", id, k, v)
			}
			if strings.HasPrefix(k, "write:") && v != "refused" {
				t.Errorf("%s: %s: %s", id, k, v)
			}
		}
		for _, p := range []string{"/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq", "/sys"} {
			if lines["mount:"+p] != "ro" {
				t.Errorf("%s: %s is not mounted read-only (%q):\n%s", id, p, lines["mount:"+p], out)
			}
		}
		if lines["write:/proc/sys/net/ipv4/ip_forward"] == "" {
			t.Errorf("%s: no /proc/sys/net/ipv4/ip_forward:\n%s", id, out)
		}
		if !strings.Contains(out, "00:00:00:00:00:00\n") || !strings.Contains(out, "sys refused") {
			t.Errorf("%s: /sys not mounted read-only:\n%s%s", id, out, r.Stderr)
		}
	}
}

// Ordinary work keeps running under the profile: numpy and pandas (with their threads), threads, subprocess,
// venv, git, ps, top, ls -R, tar, curl to a server on loopback, netlink (ip, ss), in a sandbox and a fork child,
// from exec and from the interpreter.
func TestOrdinaryWorkUnderSyscallPolicy(t *testing.T) {
	s := testserver.Start(t)
	parent := s.Create(t, nil)
	kid := s.Fork(t, parent, 1)[0]
	steps := []struct{ name, cmd string }{
		{"numpy", `python3 -c 'import numpy as np; a = np.random.rand(300, 300); print(round(float((a @ a.T).trace()) > 0))'`},
		{"pandas", `python3 -c 'import pandas as pd; print(pd.DataFrame({"a": [1, 2, 3]}).a.sum())'`},
		{"threads", `python3 -c '
import threading, concurrent.futures as f
with f.ThreadPoolExecutor(8) as ex: print(sum(ex.map(lambda x: x * x, range(100))))'`},
		{"subprocess", `python3 -c 'import subprocess; print(subprocess.run(["echo", "hi"], capture_output=True, text=True).stdout.strip())'`},
		{"venv", `python3 -m venv --without-pip /tmp/venv && /tmp/venv/bin/python -c 'import sys; print(sys.prefix)'`},
		{"pip", `if command -v pip >/dev/null; then pip --version >/dev/null && echo ok; else python3 -c 'import sysconfig; print("ok")'; fi`},
		{"git", `cd /tmp && rm -rf repo && git init -q repo && cd repo && echo x > f && git add f && git -c user.email=a@b -c user.name=a commit -qm m && git log --oneline | wc -l`},
		{"ps", `ps aux >/dev/null && echo ok`},
		{"top", `top -bn1 | head -1 | cut -c1-3`},
		{"ls -R", `ls -R /usr/lib/python3 >/dev/null && echo ok`},
		{"tar", `tar czf /tmp/t.tgz -C /etc . 2>/dev/null; tar tzf /tmp/t.tgz | grep -cx ./passwd`},
		{"curl loopback", `python3 -c '
import http.server, threading, subprocess
s = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=s.serve_forever, daemon=True).start()
print(subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:%d/" % s.server_port], capture_output=True, text=True).stdout)' 2>/dev/null`},
		{"ip", `ip -o link show lo | grep -c LOOPBACK`},
		{"ss", `ss -tln >/dev/null && echo ok`},
		{"getaddrinfo", `python3 -c 'import socket; print(len(socket.getaddrinfo("localhost", 80)) > 0)'`},
		{"compiler", `if command -v cc >/dev/null; then printf 'int main(){return 0;}' > /tmp/a.c && cc -o /tmp/a /tmp/a.c && /tmp/a && echo ok; else echo ok; fi`},
	}
	want := map[string]string{
		"numpy": "1", "pandas": "6", "threads": "328350", "subprocess": "hi", "venv": "/tmp/venv", "pip": "ok",
		"git": "1", "ps": "ok", "top": "top", "ls -R": "ok", "tar": "1", "curl loopback": "200", "ip": "1",
		"ss": "ok", "getaddrinfo": "True", "compiler": "ok",
	}
	for _, id := range []string{parent, kid} {
		for _, st := range steps {
			r := s.Sh(t, id, st.cmd)
			if got := strings.TrimSpace(r.Stdout); got != want[st.name] || r.ExitCode != 0 {
				t.Errorf("%s: %s: exit %d, stdout %q (want %q), stderr %q", id, st.name, r.ExitCode, got, want[st.name], r.Stderr)
			}
		}
		// The same from the interpreter itself: threads (numpy's BLAS pool, Python's), subprocess.
		v := s.Value(t, id, `
import numpy as np, pandas as pd, threading, subprocess
a = np.random.rand(400, 400)
ts = [threading.Thread(target=lambda: a @ a) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
(float(pd.Series([1, 2, 3]).sum()), subprocess.run(["true"]).returncode)`)
		if v != "(6.0, 0)" {
			t.Errorf("%s: interpreter work: %s", id, v)
		}
	}
}
