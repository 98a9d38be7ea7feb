package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startTestSession runs the agent's side of a session in this process (no sandbox, no spawner thread) over a
// socket pair, and returns the server's side.
func startTestSession(t *testing.T, r SessionRequest) *Session {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sock")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	agentSide, serverSide := conn(fds[0]), conn(fds[1])
	a := &Agent{}
	served := make(chan struct{})
	go func() {
		defer close(served)
		defer agentSide.Close()
		br := bufio.NewReader(agentSide)
		line, err := readLine(br, maxRequest)
		if err != nil {
			return
		}
		var req Request
		if err := json.Unmarshal(line, &req); err != nil {
			return
		}
		if req.Cwd == "" {
			req.Cwd = os.TempDir()
		}
		a.session(agentSide, br, req)
	}()
	s, err := startSession(context.Background(), serverSide, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		<-served
	})
	return s
}

func TestSessionPtyHasTerminalSizeAndExitStatus(t *testing.T) {
	s := startTestSession(t, SessionRequest{Argv: []string{"/bin/sh", "-c", "tty; stty size; read l; echo got=$l; stty size; exit 3"},
		Env: map[string]string{"TERM": "vt100"}, Tty: true, Rows: 30, Cols: 100})
	if s.Pty == nil {
		t.Fatal("no pty")
	}
	out := bufio.NewReader(s.Pty)
	want := func(prefix string) string {
		t.Helper()
		for {
			line, err := out.ReadString('\n')
			if err != nil {
				t.Fatalf("read pty waiting for %q: %v", prefix, err)
			}
			if strings.HasPrefix(strings.TrimSpace(line), prefix) {
				return strings.TrimSpace(line)
			}
		}
	}
	want("/dev/pts/")
	want("30 100")
	if err := s.Resize(40, 120); err != nil {
		t.Fatal(err)
	}
	s.Pty.Write([]byte("hello\n"))
	want("got=hello")
	want("40 120")
	code, err := s.Wait()
	if err != nil || code != 3 {
		t.Fatalf("exit %d, %v; want 3", code, err)
	}
}

func TestSessionPipesSeparateStreams(t *testing.T) {
	s := startTestSession(t, SessionRequest{Argv: []string{"/bin/sh", "-c", "cat; echo oops >&2; exit 5"}})
	s.Stdin.Write([]byte("in and out\n"))
	s.Stdin.Close()
	stdout, _ := io.ReadAll(s.Stdout)
	stderr, _ := io.ReadAll(s.Stderr)
	if string(stdout) != "in and out\n" || string(stderr) != "oops\n" {
		t.Fatalf("stdout %q, stderr %q", stdout, stderr)
	}
	if code, err := s.Wait(); err != nil || code != 5 {
		t.Fatalf("exit %d, %v; want 5", code, err)
	}
}

func TestSessionCloseKillsItsProcesses(t *testing.T) {
	pidFile := t.TempDir() + "/pid"
	s := startTestSession(t, SessionRequest{Argv: []string{"/bin/sh", "-c", "sleep 600 & echo $! > " + pidFile + "; wait"}})
	pid := readPid(t, pidFile)
	killLater(t, pid)
	s.Close()
	if !goneWithin(pid, 10*time.Second) {
		t.Fatal("the session's background process survived its close")
	}
}

func TestSessionCommandNotFound(t *testing.T) {
	s := startTestSession(t, SessionRequest{Argv: []string{"/no/such/command"}})
	if s.Started() {
		t.Fatal("started")
	}
	if code, _ := s.Wait(); code != 127 || s.Message() == "" {
		t.Fatalf("exit %d (%q), want 127 and a message", code, s.Message())
	}
}
