package integration

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

func TestIsolationBetweenSandboxes(t *testing.T) {
	s := testserver.Start(t)
	a := create(t, s, nil)
	b := create(t, s, nil)
	infoA, _ := s.Client.Get(ctxT(t), a)
	infoB, _ := s.Client.Get(ctxT(t), b)
	if infoA.IP == infoB.IP || infoA.Hostname == infoB.Hostname {
		t.Fatalf("sandboxes share ip or hostname: %+v %+v", infoA, infoB)
	}

	// Files: a secret in A is invisible in B.
	sh(t, s, a, "echo secret > /root/secret.txt; echo secret > /tmp/secret.txt")
	if r := sh(t, s, b, "cat /root/secret.txt /tmp/secret.txt 2>&1; ls /root"); strings.Contains(r.Stdout, "secret\n") {
		t.Fatalf("B sees A's files: %q", r.Stdout)
	}
	// Processes: A's marked process is not visible or killable from B, even as root.
	sh(t, s, a, "sleep 1000 --marker-a >/dev/null 2>&1 & echo started")
	// (The marker is assembled at run time so that B's own shell command line does not contain it.)
	if r := sh(t, s, b, `m=marker; ps -eo args | grep -v grep | grep -c "$m-a"; pkill -f "$m-a"; pkill -9 python3; true`); strings.TrimSpace(strings.Split(r.Stdout, "\n")[0]) != "0" {
		t.Fatalf("B sees A's processes: %q", r.Stdout)
	}
	if r := sh(t, s, a, "pgrep -f marker-a >/dev/null && echo alive"); r.Stdout != "alive\n" {
		t.Fatalf("A's process died after pkill in B: %q", r.Stdout)
	}
	if v := value(t, s, a, "'interpreter alive'"); v != "'interpreter alive'" {
		t.Fatal("A's interpreter hurt by B")
	}
	// Network: B has only its own address, and cannot reach A's listener, neither by A's address nor via loopback.
	r := sh(t, s, b, "ip -4 -o addr show | awk '{print $4}'")
	if strings.Contains(r.Stdout, infoA.IP+"/") || !strings.Contains(r.Stdout, infoB.IP+"/") {
		t.Fatalf("B's addresses: %q", r.Stdout)
	}
	value(t, s, a, `import socket, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind(('0.0.0.0', 8765)); srv.listen()
def serve():
    while True:
        c, _ = srv.accept(); c.sendall(b'hello from a'); c.close()
threading.Thread(target=serve, daemon=True).start()
1`)
	// The host (gateway side) reaches A's port: the listener really is up.
	if r := sh(t, s, a, "python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', 8765), 2); print(s.recv(100).decode())\""); r.Stdout != "hello from a\n" {
		t.Fatalf("A cannot reach its own listener: %+v", r)
	}
	probe := func(addr string) string {
		return sh(t, s, b, fmt.Sprintf("python3 -c \"import socket\ntry:\n    s=socket.create_connection(('%s', 8765), 2); print('reached', s.recv(100))\nexcept Exception as e:\n    print('blocked', type(e).__name__)\"", addr)).Stdout
	}
	if out := probe(infoA.IP); !strings.HasPrefix(out, "blocked") {
		t.Fatalf("B reached A over the bridge: %q", out)
	}
	if out := probe("127.0.0.1"); !strings.HasPrefix(out, "blocked") {
		t.Fatalf("B reached A over loopback: %q", out)
	}
}

func TestRootInSandboxCannotTouchHost(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	canary := "/tmp/ramify-host-canary-" + fmt.Sprint(os.Getpid())
	if err := os.WriteFile(canary, []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(canary)
	hostName, _ := os.Hostname()
	passwd, _ := os.ReadFile("/etc/passwd")

	r := sh(t, s, id, fmt.Sprintf(`id -u
cat %[1]s 2>&1 || true
echo pwned > %[1]s; echo 'evil:x:0:0::/:/bin/sh' >> /etc/passwd
hostname evil-host
echo 1 > /proc/sys/kernel/sysrq 2>&1 || echo sysctl-denied
mount -t tmpfs x /mnt 2>&1 && echo mounted-own-tmpfs
mknod /tmp/sda b 8 0 2>&1 || echo mknod-denied
cat /proc/1/cmdline | tr '\0' ' '; echo
ls /proc/1/root/ 2>&1 | head -5
`, canary))
	t.Logf("inside: %s", r.Stdout)
	if !strings.HasPrefix(r.Stdout, "0\n") {
		t.Fatalf("not root inside: %q", r.Stdout)
	}
	if strings.Contains(r.Stdout, "host\n") {
		t.Errorf("sandbox read the host file %s", canary)
	}
	if b, _ := os.ReadFile(canary); string(b) != "host\n" {
		t.Errorf("host canary changed to %q", b)
	}
	if b, _ := os.ReadFile("/etc/passwd"); string(b) != string(passwd) {
		t.Errorf("host /etc/passwd changed")
	}
	if h, _ := os.Hostname(); h != hostName {
		t.Errorf("host hostname changed to %q", h)
	}
	if !strings.Contains(r.Stdout, "sysctl-denied") || !strings.Contains(r.Stdout, "mknod-denied") {
		t.Errorf("sysctl or mknod allowed: %q", r.Stdout)
	}
	// Host files as seen from the host through the sandbox's user: the sandbox's root is host uid 100000.
	r = sh(t, s, id, "cat /proc/self/uid_map")
	if !strings.Contains(r.Stdout, "100000") {
		t.Errorf("uid_map %q does not map to 100000", r.Stdout)
	}
}

func TestLimitsContainForkBombAndMemoryHog(t *testing.T) {
	s := testserver.Start(t)
	victim := create(t, s, nil)
	value(t, s, victim, "v = 'untouched'")
	bomb := create(t, s, &client.CreateRequest{MaxProcs: 64, MemMiB: 256})

	// The bomb runs until exec's timeout kills it, with everything it started (jobs an exec leaves running when
	// its command ends on its own outlive it, and would keep this sandbox's pids limit full). The bomb runs in
	// a subshell and the shell waits in a loop of builtins: a non-interactive bash exits when a fork of its own
	// fails (the bomb's, or a sleep's, once the pids limit is full), and would leave the bomb running.
	to := 5
	start := time.Now()
	res, err := s.Client.Exec(ctxT(t), bomb, client.ExecRequest{Cmd: "(bomb() { bomb | bomb & }; bomb) & while :; do :; done", TimeoutS: &to})
	if res != nil {
		t.Logf("fork bomb: exit %d timed_out %v after %s, err %v", res.ExitCode, res.TimedOut, time.Since(start), err)
	}
	if err != nil {
		t.Fatalf("fork bomb broke the API: %v", err)
	}
	if !res.TimedOut {
		t.Fatalf("the bomb's shell ended before its timeout (exit %d): the bomb may be running still", res.ExitCode)
	}
	// The server and the other sandbox are fine.
	if v := value(t, s, victim, "v"); v != "'untouched'" {
		t.Fatalf("victim: %q", v)
	}
	if _, err := s.Client.Health(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	// Memory: a 1 GiB allocation under a 256 MiB limit kills the interpreter, not the server nor the neighbour.
	ex := run(t, s, bomb, "b = bytearray(1 << 30); b[::4096] = b'x' * len(b[::4096]); len(b)")
	if ex.Error == nil || ex.Error.Name != "InterpreterDied" {
		t.Fatalf("memory hog: %+v / %+v", ex, ex.Error)
	}
	// The sandbox recovers with a fresh interpreter.
	if v := value(t, s, bomb, "1 + 1"); v != "2" {
		t.Fatalf("after OOM: %q", v)
	}
	if v := value(t, s, victim, "v"); v != "'untouched'" {
		t.Fatalf("victim after OOM: %q", v)
	}
}

func TestBadInput(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	unknown := "sbx_00000000000000000000000000000000"

	code, body := raw(t, s, "GET", "/v1/sandboxes", "", nil)
	wantError(t, code, body, 401, "invalid api key")
	code, body = raw(t, s, "GET", "/v1/sandboxes", "wrong", nil)
	wantError(t, code, body, 401, "invalid api key")
	code, body = raw(t, s, "GET", "/v1/sandboxes/"+unknown, s.Key, nil)
	wantError(t, code, body, 404, "sandbox not found")
	code, body = raw(t, s, "GET", "/v1/sandboxes/not-an-id", s.Key, nil)
	wantError(t, code, body, 404, "sandbox not found")
	code, body = raw(t, s, "DELETE", "/v1/sandboxes/"+unknown, s.Key, nil)
	wantError(t, code, body, 404, "sandbox not found")
	code, body = raw(t, s, "POST", "/v1/sandboxes/"+unknown+"/run_code", s.Key, []byte(`{"code":"1"}`))
	wantError(t, code, body, 404, "sandbox not found")
	code, body = raw(t, s, "POST", "/v1/sandboxes", s.Key, []byte(`{"vcpu": `))
	wantError(t, code, body, 400, "malformed JSON")
	code, body = raw(t, s, "POST", "/v1/sandboxes", s.Key, []byte(`{"cpus": 2}`))
	wantError(t, code, body, 400, "unknown field")
	code, body = raw(t, s, "POST", "/v1/sandboxes", s.Key, []byte(`{"mem_mib": 1}`))
	wantError(t, code, body, 400, "mem_mib must be between")
	code, body = raw(t, s, "POST", "/v1/sandboxes/"+id+"/run_code", s.Key, []byte(`not json`))
	wantError(t, code, body, 400, "malformed JSON")
	code, body = raw(t, s, "POST", "/v1/sandboxes/"+id+"/exec", s.Key, []byte(`{}`))
	wantError(t, code, body, 400, "exactly one of cmd and argv")
	big := []byte(`{"code": "` + strings.Repeat("x", 9<<20) + `"}`)
	code, body = raw(t, s, "POST", "/v1/sandboxes/"+id+"/run_code", s.Key, big)
	wantError(t, code, body, 413, "too large")
	code, body = raw(t, s, "GET", "/v1/sandboxes/"+id+"/files?path=relative/path", s.Key, nil)
	wantError(t, code, body, 400, "absolute")
	code, body = raw(t, s, "GET", "/v1/sandboxes/"+id+"/files?path=/no/such/file", s.Key, nil)
	wantError(t, code, body, 404, "")
	code, body = raw(t, s, "GET", "/v1/nope", s.Key, nil)
	wantError(t, code, body, 404, "no such route")
	code, body = raw(t, s, "PATCH", "/v1/sandboxes/"+id, s.Key, nil)
	wantError(t, code, body, 405, "not allowed")

	// Path escapes are confined to the sandbox: ../ and symlinks resolve inside its root.
	sh(t, s, id, "ln -s / /root/hostroot; ln -s /etc/passwd /root/pw; echo sandbox-passwd-marker >> /etc/passwd")
	for _, p := range []string{"/../../../etc/passwd", "/root/pw", "/root/hostroot/etc/passwd"} {
		rc, err := s.Client.ReadFile(ctxT(t), id, p)
		if err != nil {
			t.Errorf("read %s: %v", p, err)
			continue
		}
		var sb strings.Builder
		buf := make([]byte, 1<<16)
		for {
			n, err := rc.Read(buf)
			sb.Write(buf[:n])
			if err != nil {
				break
			}
		}
		rc.Close()
		if !strings.Contains(sb.String(), "sandbox-passwd-marker") {
			t.Errorf("read %s reached a file outside the sandbox", p)
		}
	}
	hostPasswd, _ := os.ReadFile("/etc/passwd")
	if _, err := s.Client.WriteFile(ctxT(t), id, "/root/hostroot/etc/ramify-escape", strings.NewReader("x"), 0o644); err != nil {
		t.Logf("write through symlink: %v", err)
	}
	if _, err := os.Stat("/etc/ramify-escape"); err == nil {
		os.Remove("/etc/ramify-escape")
		t.Fatal("a write through a symlink escaped to the host")
	}
	if b, _ := os.ReadFile("/etc/passwd"); string(b) != string(hostPasswd) {
		t.Fatal("host /etc/passwd changed")
	}

	// Delete twice: the second is 404.
	if err := s.Client.Delete(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	code, body = raw(t, s, "DELETE", "/v1/sandboxes/"+id, s.Key, nil)
	wantError(t, code, body, 404, "sandbox "+id+" was deleted at")
	code, _ = raw(t, s, "GET", "/healthz", "", nil)
	if code != http.StatusOK {
		t.Fatalf("healthz %d", code)
	}
}

func TestServerRestart(t *testing.T) {
	s := testserver.Start(t)
	keep := create(t, s, &client.CreateRequest{Metadata: map[string]string{"k": "v"}})
	value(t, s, keep, "counter = 7")
	sh(t, s, keep, "echo persisted > /root/file.txt")
	lost := create(t, s, nil)

	s.Restart()
	info, err := s.Client.Get(ctxT(t), keep)
	if err != nil || info.Status != "running" || info.Metadata["k"] != "v" {
		t.Fatalf("after graceful restart: %+v, %v", info, err)
	}
	if v := value(t, s, keep, "counter + 1"); v != "8" {
		t.Fatalf("interpreter state after restart: %q", v)
	}

	// A crash (SIGKILL) of the server, during which one sandbox's processes die too.
	s.Kill()
	if err := killSandboxProcesses(lost); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	if v := value(t, s, keep, "counter"); v != "7" {
		t.Fatalf("after crash restart: %q", v)
	}
	if r := sh(t, s, keep, "cat /root/file.txt"); r.Stdout != "persisted\n" {
		t.Fatalf("file after restart: %q", r.Stdout)
	}
	info, err = s.Client.Get(ctxT(t), lost)
	if err != nil || info.Status != "error" || !strings.Contains(info.Error, "restart") {
		t.Fatalf("lost sandbox: %+v, %v", info, err)
	}
	list, _ := s.Client.List(ctxT(t), client.ListOptions{})
	if len(list) != 2 {
		t.Fatalf("list after restart has %d sandboxes", len(list))
	}
	// The errored sandbox can still be deleted, and leaves nothing behind.
	if err := s.Client.Delete(ctxT(t), lost); err != nil {
		t.Fatal(err)
	}
}
