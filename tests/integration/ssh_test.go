package integration

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// sshEnv is what the OpenSSH client needs to reach one sandbox: keys, a known_hosts file with the server's host
// key (from GET), the port.
type sshEnv struct {
	t          *testing.T
	dir        string
	key, other string // private keys: authorized at create, and not (yet)
	knownHosts string
	port, id   string
}

func needOpenSSH(t *testing.T) {
	for _, b := range []string{"ssh", "ssh-keygen", "sftp", "scp"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not installed (scripts/setup installs openssh-client)", b)
		}
	}
}

func keygen(t *testing.T, path string) string {
	t.Helper()
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v %s", err, out)
	}
	pub, err := os.ReadFile(path + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(pub))
}

// target reads the sandbox's ssh info and points the client at it.
func (e *sshEnv) target(s *testserver.Server) {
	e.t.Helper()
	sb, err := s.Client.Get(ctxT(e.t), e.id)
	if err != nil {
		e.t.Fatal(err)
	}
	if sb.SSH == nil || sb.SSH.KnownHosts == "" || !strings.HasPrefix(sb.SSH.Command, "ssh -p ") {
		e.t.Fatalf("ssh info: %+v", sb.SSH)
	}
	if err := os.WriteFile(e.knownHosts, []byte(sb.SSH.KnownHosts+"\n"), 0o600); err != nil {
		e.t.Fatal(err)
	}
	e.port = strings.Fields(sb.SSH.Command)[2]
}

func (e *sshEnv) opts(key string) []string {
	return []string{"-i", key, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
		"-o", "UserKnownHostsFile=" + e.knownHosts, "-o", "GlobalKnownHostsFile=/dev/null"}
}

// ssh runs the OpenSSH client as user (the sandbox id) with key and args; it returns stdout, stderr, the status.
func (e *sshEnv) ssh(key, user, stdin string, args ...string) (string, string, int) {
	e.t.Helper()
	cmd := exec.Command("ssh", append(append(e.opts(key), "-p", e.port, user+"@127.0.0.1"), args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			e.t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

// tool runs sftp or scp (whose port flag is -P) with the authorized key.
func (e *sshEnv) tool(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, append(append(e.opts(e.key), "-P", e.port), args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

func TestSSHIntoSandbox(t *testing.T) {
	needOpenSSH(t)
	s := testserver.Start(t, "--ssh-listen", "127.0.0.1:0")
	dir := t.TempDir()
	e := &sshEnv{t: t, dir: dir, key: filepath.Join(dir, "key"), other: filepath.Join(dir, "other"),
		knownHosts: filepath.Join(dir, "known_hosts")}
	pub := keygen(t, e.key)
	otherPub := keygen(t, e.other)

	// A bad key is refused at create, with nothing made.
	code, body := raw(t, s, "POST", "/v1/sandboxes", s.Key, []byte(`{"ssh_pubkeys":["ssh-ed25519 nonsense"]}`))
	wantError(t, code, body, 400, "ssh_pubkeys[0]")

	e.id = create(t, s, &client.CreateRequest{SSHPubkeys: []string{pub}})
	e.target(s)

	t.Run("exec", func(t *testing.T) {
		stdout, stderr, code := e.ssh(e.key, e.id, "", "echo out; echo err >&2; exit 7")
		if stdout != "out\n" || !strings.Contains(stderr, "err\n") || code != 7 {
			t.Fatalf("stdout %q stderr %q status %d", stdout, stderr, code)
		}
		// stdin streams to the command; the file it writes is the sandbox's, seen by the files API.
		if _, stderr, code := e.ssh(e.key, e.id, "through ssh\n", "cat > /root/from-ssh.txt"); code != 0 {
			t.Fatalf("status %d: %s", code, stderr)
		}
		rc, err := s.Client.ReadFile(ctxT(t), e.id, "/root/from-ssh.txt")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(rc)
		rc.Close()
		if string(got) != "through ssh\n" {
			t.Fatalf("files API reads %q", got)
		}
	})

	t.Run("pty", func(t *testing.T) { sshPtySession(t, e) })

	t.Run("cli", func(t *testing.T) {
		// ramify ssh runs the system's ssh with the host key from the API in a known_hosts file of its own.
		cmd := exec.Command(testserver.Binary(t), "ssh", e.id, "-i", e.key, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
			"--", "echo", "via-cli", "&&", "exit", "4")
		cmd.Env = append(os.Environ(), "RAMIFY_API_URL="+s.URL, "RAMIFY_API_KEY="+s.Key, "XDG_CACHE_HOME="+filepath.Join(dir, "cache"))
		out, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 4 || string(out) != "via-cli\n" {
			t.Fatalf("ramify ssh: %v %q", err, out)
		}
		if kh, _ := os.ReadFile(filepath.Join(dir, "cache", "ramify", "known_hosts")); !strings.Contains(string(kh), "ssh-ed25519 ") {
			t.Fatalf("ramify's known_hosts: %q", kh)
		}
	})

	t.Run("sftp and scp", func(t *testing.T) {
		data := make([]byte, 3<<20+17) // many write requests in flight
		rand.Read(data)
		local := filepath.Join(dir, "data.bin")
		if err := os.WriteFile(local, data, 0o755); err != nil {
			t.Fatal(err)
		}
		batch := filepath.Join(dir, "batch")
		back := filepath.Join(dir, "back.bin")
		os.WriteFile(batch, []byte("mkdir /root/up\nput "+local+" /root/up/data.bin\nls -l /root/up\nget /root/up/data.bin "+back+"\n"), 0o600)
		if out := e.tool(t, "sftp", "-b", batch, e.id+"@127.0.0.1"); !strings.Contains(out, "data.bin") {
			t.Fatalf("sftp ls: %s", out)
		}
		if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
			t.Fatalf("sftp round trip: %d bytes back of %d", len(got), len(data))
		}
		// scp (SFTP protocol in OpenSSH 9), both ways; -p keeps the mode.
		e.tool(t, "scp", "-p", local, e.id+"@127.0.0.1:/tmp/scp.bin")
		scpBack := filepath.Join(dir, "scp-back.bin")
		e.tool(t, "scp", e.id+"@127.0.0.1:/tmp/scp.bin", scpBack)
		if got, _ := os.ReadFile(scpBack); !bytes.Equal(got, data) {
			t.Fatalf("scp round trip: %d bytes back of %d", len(got), len(data))
		}
		if out, _, _ := e.ssh(e.key, e.id, "", "stat -c '%a %u' /tmp/scp.bin; sha256sum < /tmp/scp.bin"); !strings.HasPrefix(out, "755 0\n") {
			t.Fatalf("in the sandbox: %q", out)
		}
		// sftp stays inside the sandbox: .. and absolute paths resolve in its root.
		os.WriteFile(batch, []byte("get /../../../../etc/hostname "+filepath.Join(dir, "hn")+"\n"), 0o600)
		e.tool(t, "sftp", "-b", batch, e.id+"@127.0.0.1")
		hn, _ := os.ReadFile(filepath.Join(dir, "hn"))
		if !strings.HasPrefix(string(hn), "sbx-") {
			t.Fatalf("sftp read %q, not the sandbox's /etc/hostname", hn)
		}
	})

	t.Run("fork inherits keys", func(t *testing.T) {
		kids, err := s.Client.Fork(ctxT(t), e.id, 1)
		if err != nil {
			t.Fatal(err)
		}
		if out, stderr, code := e.ssh(e.key, kids[0], "", "cat /root/from-ssh.txt"); out != "through ssh\n" || code != 0 {
			t.Fatalf("ssh into the fork child: %q %q %d", out, stderr, code)
		}
	})

	t.Run("refused", func(t *testing.T) {
		if _, stderr, code := e.ssh(e.other, e.id, "", "true"); code != 255 || !strings.Contains(stderr, "Permission denied") {
			t.Fatalf("unauthorized key: status %d, %q", code, stderr)
		}
		if _, stderr, code := e.ssh(e.key, "sbx_0123456789abcdef0123456789abcdef", "", "true"); code != 255 || !strings.Contains(stderr, "no sandbox") {
			t.Fatalf("unknown sandbox: status %d, %q", code, stderr)
		}
		if _, stderr, code := e.ssh(e.key, e.id, "", "-R", "0:127.0.0.1:22", "-o", "ExitOnForwardFailure=yes", "-N"); code != 255 {
			t.Fatalf("port forwarding: status %d, %q", code, stderr)
		}
	})

	t.Run("keys added later, kept across pause and restart", func(t *testing.T) {
		sb, err := s.Client.AddSSHKeys(ctxT(t), e.id, []string{otherPub, pub})
		if err != nil {
			t.Fatal(err)
		}
		if len(sb.SSH.Keys) != 2 || !strings.HasPrefix(sb.SSH.Keys[1].Fingerprint, "SHA256:") {
			t.Fatalf("keys after add: %+v", sb.SSH.Keys)
		}
		if out, _, code := e.ssh(e.other, e.id, "", "echo ok"); out != "ok\n" || code != 0 {
			t.Fatalf("added key: %q %d", out, code)
		}
		if _, _, err := s.Client.Pause(ctxT(t), e.id); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Client.WaitStatus(ctxT(t), e.id, client.StatusPaused); err != nil {
			t.Fatal(err)
		}
		if _, stderr, code := e.ssh(e.key, e.id, "", "true"); code == 0 || !strings.Contains(stderr, "paused") {
			t.Fatalf("paused sandbox: status %d, %q", code, stderr)
		}
		// A fork of the paused sandbox may authorize one more key.
		third := filepath.Join(dir, "third")
		thirdPub := keygen(t, third)
		kids, err := s.Client.ForkWith(ctxT(t), e.id, client.ForkRequest{N: 1, SSHPubkeys: []string{thirdPub}})
		if err != nil {
			t.Fatal(err)
		}
		kid, err := s.Client.WaitStatus(ctxT(t), kids[0], client.StatusRunning)
		if err != nil {
			t.Fatal(err)
		}
		if kid.SSH == nil || len(kid.SSH.Keys) != 3 {
			t.Fatalf("fork of a paused sandbox: keys %+v", kid.SSH)
		}
		if out, stderr, code := e.ssh(third, kids[0], "", "cat /root/from-ssh.txt"); out != "through ssh\n" || code != 0 {
			t.Fatalf("ssh into the paused sandbox's fork with the added key: %q %q %d", out, stderr, code)
		}
		if _, _, code := e.ssh(third, e.id, "", "true"); code != 255 {
			t.Fatalf("the fork's added key opens the parent: status %d", code)
		}
		s.Restart() // the host key is the same after a restart (known_hosts still trusts it)
		if _, _, err := s.Client.Resume(ctxT(t), e.id); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Client.WaitStatus(ctxT(t), e.id, client.StatusRunning); err != nil {
			t.Fatal(err)
		}
		old := e.knownHosts
		e.knownHosts = filepath.Join(dir, "known_hosts.2")
		e.target(s)
		a, _ := os.ReadFile(old)
		b, _ := os.ReadFile(e.knownHosts)
		if strings.Fields(string(a))[2] != strings.Fields(string(b))[2] {
			t.Fatalf("host key changed across a restart:\n%s\n%s", a, b)
		}
		if out, stderr, code := e.ssh(e.other, e.id, "", "cat /root/from-ssh.txt"); out != "through ssh\n" || code != 0 {
			t.Fatalf("after pause, restart, resume: %q %q %d", out, stderr, code)
		}
	})
}

// sshPtySession drives an interactive `ssh -tt` from a terminal of the test's own: the shell has a PTY of the
// terminal's size, a resize reaches it, and its exit status comes back.
func sshPtySession(t *testing.T, e *sshEnv) {
	master, slave := openTestPty(t, 24, 80)
	cmd := exec.Command("ssh", append(e.opts(e.key), "-tt", "-p", e.port, e.id+"@127.0.0.1")...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	var werr error
	exited := make(chan struct{})
	go func() { werr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	out := &ptyOutput{changed: make(chan struct{}, 1)}
	go out.read(master)
	send := func(s string) {
		if _, err := master.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	// The markers are computed by the shell, so the echo of the typed line never matches them.
	send("echo T=$(tty)-$((40+2))\n")
	out.want(t, "T=/dev/pts/")
	send("echo S=$(stty size)-$((40+2))\n")
	out.want(t, "S=24 80-42")
	if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 50, Col: 132}); err != nil {
		t.Fatal(err)
	}
	// ssh sends the window change when it gets SIGWINCH; ask until the shell sees it.
	deadline := time.Now().Add(30 * time.Second)
	for !out.has("S=50 132-42") {
		if time.Now().After(deadline) {
			t.Fatalf("the resize never reached the sandbox; output:\n%s", out.String())
		}
		send("echo S=$(stty size)-$((40+2))\n")
		out.waitChange(time.Second)
	}
	send("exit 3\n")
	select {
	case <-exited:
		if ee, ok := werr.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
			t.Fatalf("ssh ended with %v, want status 3; output:\n%s", werr, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("ssh did not exit; output:\n%s", out.String())
	}
}

func openTestPty(t *testing.T, rows, cols uint16) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetWinsize(int(m.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatal(err)
	}
	return m, s
}

// ptyOutput collects what a terminal shows.
type ptyOutput struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func (o *ptyOutput) read(f *os.File) {
	b := make([]byte, 4096)
	for {
		n, err := f.Read(b)
		if n > 0 {
			o.mu.Lock()
			o.buf.Write(b[:n])
			o.mu.Unlock()
			select {
			case o.changed <- struct{}{}:
			default:
			}
		}
		if err != nil {
			return
		}
	}
}

func (o *ptyOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

func (o *ptyOutput) has(s string) bool { return strings.Contains(o.String(), s) }

func (o *ptyOutput) waitChange(d time.Duration) {
	select {
	case <-o.changed:
	case <-time.After(d):
	}
}

// want waits (bounded) until the terminal has shown s.
func (o *ptyOutput) want(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !o.has(s) {
		if time.Now().After(deadline) {
			t.Fatalf("terminal never showed %q; output:\n%s", s, o.String())
		}
		o.waitChange(time.Second)
	}
}

// A delete ends an sftp upload in flight: the upload holds the sandbox until its client closes the file, and a
// client that stalls (or never closes) held the delete for as long. The delete answers at once, and the
// client's close of the file fails: nothing is written.
func TestDeleteStopsAStalledSFTPUpload(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0", "--ssh-listen", "127.0.0.1:0")
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	pub := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
	id := create(t, s, &client.CreateRequest{SSHPubkeys: []string{pub}})
	sb, err := s.Client.Get(ctxT(t), id)
	if err != nil || sb.SSH == nil {
		t.Fatalf("ssh info: %+v %v", sb.SSH, err)
	}
	port := strings.Fields(sb.SSH.Command)[2]
	conn, err := ssh.Dial("tcp", "127.0.0.1:"+port, &ssh.ClientConfig{User: id, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sc, err := sftp.NewClient(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	f, err := sc.Create("/root/stalled.bin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		t.Fatalf("the upload's first MiB: %v", err)
	}
	// ... and then nothing more: the client neither writes nor closes.
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctxT(t), 30*time.Second)
	defer cancel()
	if err := s.Client.Delete(dctx, id); err != nil {
		t.Fatalf("delete with an sftp upload in flight: %v after %v", err, time.Since(start))
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the delete took %v with an sftp upload in flight", took)
	}
	if err := f.Close(); err == nil {
		t.Errorf("closing the upload of a deleted sandbox succeeded")
	}
	checkNoLeftovers(t, s, expect{})
}
