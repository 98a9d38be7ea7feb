package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/ramify-dev/ramify/internal/seccomp"
)

// exec runs a command in the sandbox and returns the terminal "exit" event.
func (a *Agent) exec(ctx context.Context, req Request, emit func(Event)) Event {
	var argv []string //nolint:prealloc
	switch {
	case len(req.Argv) > 0:
		argv = req.Argv
	case req.Cmd != "":
		argv = []string{"/bin/sh", "-c", req.Cmd}
	default:
		return Event{Type: "error", Message: "exec needs cmd or argv"}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = a.environ(req.Env)
	cmd.Dir = a.workdir(req.Cwd)
	if req.Stdin != "" {
		cmd.Stdin = strings.NewReader(req.Stdin)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out, errOut capped
	out.limit, errOut.limit = outputLimit, outputLimit
	var mu sync.Mutex
	var wg sync.WaitGroup
	pipe := func(r io.Reader, typ string, acc *capped) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		var pending []byte
		for {
			n, err := r.Read(buf)
			if n > 0 {
				pending = append(pending, buf[:n]...)
				// Send only whole UTF-8 sequences; keep a split rune for the next read.
				cut := validPrefix(pending)
				if cut > 0 {
					s := string(pending[:cut])
					pending = append(pending[:0], pending[cut:]...)
					mu.Lock()
					acc.add(s)
					mu.Unlock()
					emit(Event{Type: typ, Data: s})
				}
			}
			if err != nil {
				if len(pending) > 0 {
					s := strings.ToValidUTF8(string(pending), "\uFFFD")
					mu.Lock()
					acc.add(s)
					mu.Unlock()
					emit(Event{Type: typ, Data: s})
				}
				return
			}
		}
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return Event{Type: "error", Message: err.Error()}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return Event{Type: "error", Message: err.Error()}
	}
	if err := a.startFiltered(cmd); err != nil {
		msg := err.Error()
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return Event{Type: "exit", ExitCode: 127, Stderr: msg + "\n"}
		}
		return Event{Type: "exit", ExitCode: 126, Stderr: msg + "\n"}
	}
	os.WriteFile("/proc/"+itoa(cmd.Process.Pid)+"/oom_score_adj", []byte("500"), 0) //nolint:errcheck // best effort
	wg.Add(2)
	go pipe(stdout, "stdout", &out)
	go pipe(stderr, "stderr", &errOut)

	done := make(chan struct{})
	var timedOut bool
	pgid := cmd.Process.Pid
	if req.TimeoutS > 0 {
		t := time.AfterFunc(time.Duration(req.TimeoutS*float64(time.Second)), func() {
			mu.Lock()
			timedOut = true
			mu.Unlock()
			syscall.Kill(-pgid, syscall.SIGKILL)
		})
		defer t.Stop()
	}
	go func() {
		select {
		case <-ctx.Done():
			syscall.Kill(-pgid, syscall.SIGKILL)
		case <-done:
		}
	}()
	// Pipes close when every holder of them exits; a background child that keeps them open is killed
	// with its process group once the command itself has exited and a short grace period passed.
	waitErr := make(chan error, 1)
	go func() {
		wg.Wait()
		waitErr <- cmd.Wait()
	}()
	var werr error
	select {
	case werr = <-waitErr:
	case <-procExited(cmd.Process.Pid):
		select {
		case werr = <-waitErr:
		case <-time.After(2 * time.Second):
			syscall.Kill(-pgid, syscall.SIGKILL)
			werr = <-waitErr
		}
	}
	close(done)
	code := 0
	if werr != nil {
		var ee *exec.ExitError
		if errors.As(werr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				code = 128 + int(ws.Signal())
			} else {
				code = ee.ExitCode()
			}
		} else {
			code = -1
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return Event{Type: "exit", ExitCode: code, TimedOut: timedOut, Stdout: out.sb.String(), Stderr: errOut.sb.String()}
}

// procExited returns a channel closed once pid has exited (become a zombie or gone), polling /proc.
func procExited(pid int) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		for {
			b, err := os.ReadFile("/proc/" + itoa(pid) + "/stat")
			if err != nil {
				close(ch)
				return
			}
			// state is the field after the ")" of comm
			if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X') {
				close(ch)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return ch
}

func validPrefix(b []byte) int {
	// Return the length of the longest prefix that does not end in a truncated UTF-8 sequence.
	n := len(b)
	for i := 1; i <= 3 && i <= n; i++ {
		c := b[n-i]
		if c < 0x80 {
			break
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(b[n-i:]) {
				return n - i
			}
			break
		}
	}
	return n
}

func itoa(i int) string { return strconv.Itoa(i) }

// startFiltered starts cmd from the agent's spawner thread, which runs under the sandbox's seccomp filter:
// the command and everything it starts inherit the filter (fork copies the calling thread's filter).
func (a *Agent) startFiltered(cmd *exec.Cmd) error {
	if a.spawn == nil {
		return cmd.Start()
	}
	done := make(chan error, 1)
	a.spawn <- func() { done <- cmd.Start() }
	return <-done
}

// runSpawner locks an OS thread, reduces its capabilities to UserCaps with no_new_privs, installs the sandbox's
// seccomp filter on it (its listener goes to the family init) and starts commands from it for the rest of the
// agent's life. Only this thread is filtered and confined: the agent's own signals (timeouts) and the interpreter,
// which confines itself and installs a filter of its own, start elsewhere.
func (a *Agent) runSpawner() error {
	ready := make(chan error, 1)
	a.spawn = make(chan func())
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread carries the filter and dies with the agent
		if err := confineThread(capMask(UserCaps)); err != nil {
			ready <- err
			return
		}
		lfd, err := seccomp.InstallOnThisThread()
		if err != nil {
			ready <- err
			return
		}
		a.supervise(lfd)
		ready <- nil
		for f := range a.spawn {
			f()
		}
	}()
	if err := <-ready; err != nil {
		a.spawn = nil
		return fmt.Errorf("seccomp filter for commands: %w", err)
	}
	return nil
}
