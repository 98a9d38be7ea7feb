//go:build linux

package seccomp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// script runs in the helper (cgroup a, under the filter, process group G shared with victim V1 of cgroup b; V1 is in
// its own network namespace; V2 of cgroup b leads its own process group) and prints "name=value" lines.
const script = `
import os, sys, signal, subprocess, ctypes, time, errno, threading
V1 = int(os.environ['V1']); V2 = int(os.environ['V2'])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def res(k, v): print(f"{k}={v}", flush=True)
def err_of(f):
    try:
        f(); return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def sc(*a):
    r = libc.syscall(*[ctypes.c_long(x) for x in a])
    return errno.errorcode[ctypes.get_errno()] if r < 0 else "ok"
def sleeper():
    return subprocess.Popen(['sleep', '1000'])

p = subprocess.run(['/bin/sh', '-c', f'kill -9 {V1}'], capture_output=True, text=True)
res('sh_kill_sibling', 'EPERM' if p.returncode != 0 and 'not permitted' in p.stderr else f'{p.returncode} {p.stderr.strip()}')
p = subprocess.run(['/bin/sh', '-c', 'sleep 1000 & c=$!; kill -9 $c; wait $c; echo $?'], capture_output=True, text=True)
res('sh_kill_own', p.stdout.strip())
res('kill_sibling', err_of(lambda: os.kill(V1, 0)))
res('kill_missing', err_of(lambda: os.kill(2**22 + 7, 0)))
res('tkill_sibling', sc(200, V1, 0))
res('tgkill_sibling', sc(234, V1, V1, 0))
res('tgkill_own', err_of(lambda: signal.pthread_kill(threading.main_thread().ident, 0)))

c = sleeper()
res('ptrace_attach_sibling', sc(101, 16, V1, 0, 0))
res('ptrace_attach_own', sc(101, 16, c.pid, 0, 0))
os.waitpid(c.pid, 0)
res('ptrace_detach_own', sc(101, 17, c.pid, 0, 0))
res('process_vm_readv_sibling', sc(310, V1, 0, 0, 0, 0, 0))
res('process_vm_readv_own', sc(310, c.pid, 0, 0, 0, 0, 0))
res('kcmp_sibling', sc(312, os.getpid(), V1, 0, 0, 0))
res('kcmp_own', sc(312, os.getpid(), c.pid, 0, 0, 0))
res('pidfd_open_sibling', err_of(lambda: os.pidfd_open(V1)))
fd = os.pidfd_open(c.pid)
res('pidfd_open_own', 'ok')
res('pidfd_send_signal_own', err_of(lambda: signal.pidfd_send_signal(fd, 0)))
r = libc.syscall(ctypes.c_long(438), ctypes.c_long(fd), ctypes.c_long(1), ctypes.c_long(0))
if r >= 0:
    st = os.fstat(r); fl = __import__('fcntl').fcntl(r, __import__('fcntl').F_GETFD)
    res('pidfd_getfd_own', 'ok' if fl & 1 else 'no-cloexec'); os.close(r)
else:
    res('pidfd_getfd_own', errno.errorcode[ctypes.get_errno()])
d = os.open(f'/proc/{V1}', os.O_DIRECTORY | os.O_RDONLY)
res('pidfd_send_signal_procdir_sibling', err_of(lambda: signal.pidfd_send_signal(d, 9)))
res('pidfd_getfd_procdir', sc(438, d, 0, 0))
res('pidfd_send_signal_self_pgrp', sc(424, -20000, 0, 0, 4))
n = os.open(f'/proc/{V1}/ns/net', os.O_RDONLY)
res('setns_sibling_net', 'ok' if libc.setns(n, 0) == 0 else errno.errorcode[ctypes.get_errno()])
n = os.open('/proc/self/ns/net', os.O_RDONLY)
res('setns_own_net', 'ok' if libc.setns(n, 0x40000000) == 0 else errno.errorcode[ctypes.get_errno()])
res('pidfd_send_signal_own_kill', err_of(lambda: signal.pidfd_send_signal(fd, 9)))
c.wait()
res('own_child_killed', c.returncode)

got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
kids = [sleeper(), sleeper()]
res('kill_0', err_of(lambda: os.kill(0, signal.SIGUSR1)))
res('kill_0_kids', ','.join(str(k.wait()) for k in kids))
time.sleep(0.2)
res('kill_0_self_handler', len(got))
res('killpg_sibling', err_of(lambda: os.killpg(V2, 9)))
kids = [sleeper(), sleeper()]
res('killpg_own', err_of(lambda: os.killpg(os.getpgrp(), signal.SIGUSR1)))
res('killpg_own_kids', ','.join(str(k.wait()) for k in kids))
kids = [sleeper(), sleeper()]
res('kill_minus1', err_of(lambda: os.kill(-1, 9)))
res('kill_minus1_kids', ','.join(str(k.wait()) for k in kids))

# The default profile, on the real kernel: closed calls fail, clone3 answers ENOSYS, ordinary work runs.
res('profile_keyctl', sc(250, 0, -2, 1))
res('profile_unshare_user', sc(272, 0x10000000))
res('profile_unshare_files', sc(272, 0x400))
res('profile_clone3', sc(435, 0, 0))
res('profile_mount', sc(165, 0, 0, 0, 0, 0))
res('profile_personality_query', sc(135, 0xffffffff))
res('profile_packet_socket', err_of(lambda: __import__('socket').socket(17, 3, 0x300)))
res('profile_tcp_socket', err_of(lambda: __import__('socket').socket().close()))
out = []
ts = [threading.Thread(target=lambda: out.append(subprocess.run(['true']).returncode)) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
res('profile_threads_subprocess', out)

c = sleeper()
N = 3000
t = time.perf_counter()
for _ in range(N): os.kill(c.pid, 0)
res('kill_us', (time.perf_counter() - t) / N * 1e6)
c.kill(); c.wait()
res('done', 1)
`

const baselineScript = `
import os, subprocess, time
c = subprocess.Popen(['sleep', '1000'])
N = 3000
t = time.perf_counter()
for _ in range(N): os.kill(c.pid, 0)
print((time.perf_counter() - t) / N * 1e6)
c.kill(); c.wait()
`

var wantResults = map[string]string{
	"sh_kill_sibling":                   "EPERM",
	"sh_kill_own":                       "137",
	"kill_sibling":                      "EPERM",
	"kill_missing":                      "ESRCH",
	"tkill_sibling":                     "EPERM",
	"tgkill_sibling":                    "EPERM",
	"tgkill_own":                        "ok",
	"ptrace_attach_sibling":             "EPERM",
	"ptrace_attach_own":                 "ok",
	"ptrace_detach_own":                 "ok",
	"process_vm_readv_sibling":          "EPERM",
	"process_vm_readv_own":              "ok",
	"kcmp_sibling":                      "EPERM",
	"kcmp_own":                          "ok",
	"pidfd_open_sibling":                "EPERM",
	"pidfd_open_own":                    "ok",
	"pidfd_send_signal_own":             "ok",
	"pidfd_getfd_own":                   "ok",
	"pidfd_send_signal_procdir_sibling": "EPERM",
	"pidfd_getfd_procdir":               "EBADF",
	"pidfd_send_signal_self_pgrp":       "EPERM",
	"setns_sibling_net":                 "EPERM",
	"setns_own_net":                     "ok",
	"pidfd_send_signal_own_kill":        "ok",
	"own_child_killed":                  "-9",
	"kill_0":                            "ok",
	"kill_0_kids":                       "-10,-10",
	"kill_0_self_handler":               "1",
	"killpg_sibling":                    "ESRCH",
	"killpg_own":                        "ok",
	"killpg_own_kids":                   "-10,-10",
	"kill_minus1":                       "ok",
	"kill_minus1_kids":                  "-9,-9",
	"done":                              "1",
	"profile_keyctl":                    "EPERM",
	"profile_unshare_user":              "EPERM",
	"profile_unshare_files":             "ok",
	"profile_clone3":                    "ENOSYS",
	"profile_mount":                     "EPERM",
	"profile_personality_query":         "ok",
	"profile_packet_socket":             "EPERM",
	"profile_tcp_socket":                "ok",
	"profile_threads_subprocess":        "[0, 0, 0, 0]",
}

// testCgroups creates <root>/ramifytest-seccomp-<pid>/{a,b} in the v1 pids hierarchy and removes them at cleanup
// (after killing what is left in them: only processes this test started can be there).
func testCgroups(t *testing.T) (a, b string) {
	t.Helper()
	root := "/sys/fs/cgroup/pids"
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		t.Skipf("no cgroup v1 pids hierarchy at %s: %v", root, err)
	}
	base := filepath.Join(root, fmt.Sprintf("ramifytest-seccomp-%d", os.Getpid()))
	a, b = filepath.Join(base, "a"), filepath.Join(base, "b")
	for _, d := range []string{base, a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatalf("create cgroup: %v", err)
		}
	}
	t.Cleanup(func() {
		for _, d := range []string{a, b} {
			for range 50 {
				data, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
				pids := strings.Fields(string(data))
				if len(pids) == 0 {
					break
				}
				for _, p := range pids {
					if n, err := strconv.Atoi(p); err == nil {
						_ = unix.Kill(n, unix.SIGKILL)
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		for _, d := range []string{a, b, base} {
			if err := os.Remove(d); err != nil {
				t.Errorf("remove cgroup: %v", err)
			}
		}
	})
	return a, b
}

func joinCgroup(t *testing.T, cg string, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("move %d to %s: %v", pid, cg, err)
	}
}

// startProcess starts a process and kills and reaps it at cleanup.
func startProcess(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
}

// describeCgroup describes the processes of a cgroup (command line, syscall, wait channel) for failure messages.
func describeCgroup(cg string) string {
	data, _ := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
	var b strings.Builder
	for _, p := range strings.Fields(string(data)) {
		cmd, _ := os.ReadFile("/proc/" + p + "/cmdline")
		sc, _ := os.ReadFile("/proc/" + p + "/syscall")
		wchan, _ := os.ReadFile("/proc/" + p + "/wchan")
		if len(cmd) > 60 {
			cmd = cmd[:60]
		}
		fmt.Fprintf(&b, "\n  %s %q syscall=%s wchan=%s", p, strings.ReplaceAll(string(cmd), "\x00", " "),
			strings.TrimSpace(string(sc)), wchan)
	}
	return b.String()
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(data), ')')
	return i > 0 && len(data) > i+2 && data[i+2] != 'Z'
}

func TestSupervisorIsolatesSandboxes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		t.Skipf("no python3: %v", err)
	}
	python := strings.TrimSpace(string(out))
	cgA, cgB := testCgroups(t)

	// The helper: cgroup a, its own process group G.
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), helperEnv+"=1", "GODEBUG=asyncpreemptoff=1",
		helperArgvEnv+"="+python+"\x1f-c\x1f"+script)
	helper.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	helper.Stderr = os.Stderr
	stdin, err := helper.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	startProcess(t, helper)
	hpid := helper.Process.Pid
	joinCgroup(t, cgA, hpid)

	// The victims, in cgroup b: V1 in process group G and in its own network namespace, V2 in its own group.
	v1 := exec.Command("sleep", "1000")
	v1.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: hpid, Cloneflags: syscall.CLONE_NEWNET}
	startProcess(t, v1)
	joinCgroup(t, cgB, v1.Process.Pid)
	v2 := exec.Command("sleep", "1000")
	v2.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	startProcess(t, v2)
	joinCgroup(t, cgB, v2.Process.Pid)

	// Take the listener from the helper.
	rd := bufio.NewReader(stdout)
	line, err := rd.ReadString('\n')
	if err != nil {
		t.Fatalf("read listener fd from helper: %v", err)
	}
	var childFD int
	if _, err := fmt.Sscanf(line, "fd %d", &childFD); err != nil {
		t.Fatalf("helper: %q", line)
	}
	hpidfd, err := unix.PidfdOpen(hpid, 0)
	if err != nil {
		t.Fatal(err)
	}
	listener, err := unix.PidfdGetfd(hpidfd, childFD, 0)
	unix.Close(hpidfd)
	if err != nil {
		t.Fatalf("pidfd_getfd listener: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	served := make(chan error, 1)
	go func() { served <- NewSupervisor("/proc", log).Serve(ctx, listener) }()

	fmt.Fprintf(stdin, "V1=%d\nV2=%d\n\n", v1.Process.Pid, v2.Process.Pid)
	stdin.Close()

	results := map[string]string{}
	done := make(chan error, 1)
	go func() {
		for {
			l, err := rd.ReadString('\n')
			if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok {
				results[k] = v
			} else if strings.TrimSpace(l) != "" {
				t.Logf("helper: %s", strings.TrimSpace(l))
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("helper script did not finish; results so far: %v; cgroup a: %s", results, describeCgroup(cgA))
	}
	if err := helper.Wait(); err != nil {
		t.Errorf("helper: %v", err)
	}

	for k, want := range wantResults {
		if got, ok := results[k]; !ok {
			t.Errorf("%s: no result", k)
		} else if got != want {
			t.Errorf("%s = %s, want %s", k, got, want)
		}
	}
	for _, v := range []*exec.Cmd{v1, v2} {
		if !alive(v.Process.Pid) {
			t.Errorf("victim %d in cgroup b died", v.Process.Pid)
		}
	}
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("Serve did not return after every filtered task exited")
	}

	out, err = exec.Command(python, "-c", baselineScript).Output()
	if err != nil {
		t.Fatalf("baseline: %v", err)
	}
	t.Logf("kill(own child, 0) from python: %s µs trapped (seccomp user notification round trip), %s µs unfiltered",
		results["kill_us"], strings.TrimSpace(string(out)))
}

// sleepingListener starts a helper that installs the filter and then sleeps, and returns the listener of its
// filter (a listener whose filtered task stays alive); the helper is killed when the test ends.
func sleepingListener(t *testing.T) int {
	t.Helper()
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), helperEnv+"=1", "GODEBUG=asyncpreemptoff=1", helperArgvEnv+"=/bin/sleep\x1f100")
	stdin, err := helper.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	startProcess(t, helper)
	var childFD int
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscanf(line, "fd %d", &childFD); err != nil {
		t.Fatalf("helper: %q", line)
	}
	pfd, err := unix.PidfdOpen(helper.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	listener, err := unix.PidfdGetfd(pfd, childFD, 0)
	unix.Close(pfd)
	if err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	return listener
}

func TestServeStopsOnContextCancel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	listener := sleepingListener(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- NewSupervisor("/proc", nil).Serve(ctx, listener) }()
	time.Sleep(100 * time.Millisecond)
	cancel()
	awaitCanceled(t, served)
	if _, err := unix.FcntlInt(uintptr(listener), unix.F_GETFD, 0); err == nil {
		t.Error("Serve did not close the listener")
	}
}

// TestServeHoldsNoThreadPerListener: a supervisor waiting on many listeners holds no OS thread per listener (a
// family init serves one for every sandbox and spare agent of the family; waiting in poll(2) held one each).
func TestServeHoldsNoThreadPerListener(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	threads := func() int {
		d, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		return len(d)
	}
	const n = 24
	listeners := make([]int, n)
	for i := range listeners {
		listeners[i] = sleepingListener(t)
	}
	before := threads()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, n)
	sup := NewSupervisor("/proc", nil)
	for _, l := range listeners {
		go func() { served <- sup.Serve(ctx, l) }()
	}
	time.Sleep(300 * time.Millisecond)
	during := threads()
	cancel()
	for range n {
		awaitCanceled(t, served)
	}
	if during-before >= n/2 {
		t.Errorf("%d threads while serving %d listeners, %d before: a thread per listener", during, n, before)
	}
}

// awaitCanceled waits for one Serve, whose context was cancelled, to return context.Canceled.
func awaitCanceled(t *testing.T, served <-chan error) {
	t.Helper()
	select {
	case err := <-served:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Serve = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}
