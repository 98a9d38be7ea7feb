package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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

// outputGrace is how long exec waits, once its command's main process has exited, for output still in the
// pipes (or written by processes the command left running) before it answers.
const outputGrace = 150 * time.Millisecond

// exec runs a command in the sandbox and returns the terminal "exit" event.
//
// The call ends when the command's main process exits: jobs it started in the background keep running, as in a
// shell on a VM (exec does not wait for them, nor kill them). Their output after that point is read and
// discarded, so that they never die of a broken pipe. A timeout, or the call being cancelled, kills everything
// the command started (see procTree) and the call returns at once with the output captured so far.
//
// Before, background jobs died with their exec: the output pipes stayed open while any of them ran, and the
// agent, after waiting 2 s past the main process's exit for them to close, killed the command's process group.
// Processes that had left it (setsid) were not killed and the call waited for them to close the pipes, past its
// timeout.
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
	// A token of this call in the command's environment, inherited by whatever it starts: a timeout finds by it
	// the processes that escaped the tracker (see procTree).
	token := execToken()
	cmd.Env = append(a.environ(req.Env), ExecIDEnv+"="+token)
	cmd.Dir = a.workdir(req.Cwd)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The command's output goes to pipes of the agent's own, not through os/exec's copying: its Wait then returns
	// when the main process exits, whoever else still holds the pipes.
	outR, outW, err := os.Pipe()
	if err != nil {
		return Event{Type: "error", Message: err.Error()}
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return Event{Type: "error", Message: err.Error()}
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	var stdinW *os.File
	if req.Stdin != "" {
		var stdinR *os.File
		if stdinR, stdinW, err = os.Pipe(); err != nil {
			outR.Close()
			outW.Close()
			errR.Close()
			errW.Close()
			return Event{Type: "error", Message: err.Error()}
		}
		cmd.Stdin = stdinR
	}
	err = a.startFiltered(cmd)
	outW.Close()
	errW.Close()
	if f, ok := cmd.Stdin.(*os.File); ok {
		f.Close()
	}
	if err != nil {
		outR.Close()
		errR.Close()
		if stdinW != nil {
			stdinW.Close()
		}
		msg := err.Error()
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return Event{Type: "exit", ExitCode: 127, Stderr: msg + "\n"}
		}
		return Event{Type: "exit", ExitCode: 126, Stderr: msg + "\n"}
	}
	pid := cmd.Process.Pid
	os.WriteFile("/proc/"+itoa(pid)+"/oom_score_adj", []byte("500"), 0) //nolint:errcheck // best effort
	if stdinW != nil {
		// Closed when the call ends: a background job that holds stdin and never reads it cannot block us.
		go func() {
			stdinW.Write([]byte(req.Stdin)) //nolint:errcheck // the command may not read it all
			stdinW.Close()
		}()
		defer stdinW.Close()
	}

	out := &execOutput{emit: emit}
	out.stdout.limit, out.stderr.limit = outputLimit, outputLimit
	var pipes sync.WaitGroup
	pipes.Add(2)
	go out.drain(outR, "stdout", &out.stdout, &pipes)
	go out.drain(errR, "stderr", &out.stderr, &pipes)

	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var timeout <-chan time.Time
	if req.TimeoutS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutS * float64(time.Second)))
		defer t.Stop()
		timeout = t.C
	}
	// Only a call that can end before its command needs to know what the command started.
	var tree *procTree
	stopTracking := func() {}
	if timeout != nil || ctx.Done() != nil {
		tree = newProcTree("/proc", pid, token)
		stopTracking = tree.track()
	}
	var werr error
	timedOut := false
	select {
	case werr = <-waited:
	case <-timeout:
		timedOut = true
		stopTracking()
		tree.kill()
		werr = <-waited
	case <-ctx.Done():
		stopTracking()
		tree.kill()
		werr = <-waited
	}
	stopTracking()

	// The main process has exited: take what is left in the pipes, waiting a little for output still on its way.
	drained := make(chan struct{})
	go func() {
		pipes.Wait()
		close(drained)
	}()
	grace := time.NewTimer(outputGrace)
	select {
	case <-drained:
	case <-grace.C:
	}
	grace.Stop()
	stdout, stderr := out.detach()
	return Event{Type: "exit", ExitCode: exitCode(werr), TimedOut: timedOut, Stdout: stdout, Stderr: stderr}
}

// execToken returns a random token that names one exec call.
func execToken() string {
	var b [8]byte
	rand.Read(b[:]) //nolint:errcheck // never fails on Linux
	return hex.EncodeToString(b[:])
}

// exitCode is a command's exit status as exec reports it: 128+signal for a command killed by a signal.
func exitCode(werr error) int {
	if werr == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return -1
}

// execOutput collects and forwards one exec's output until the call answers (detach); after that its pipes are
// still read, for processes the command left running, and what they write is dropped.
type execOutput struct {
	emit func(Event)

	mu             sync.Mutex
	stdout, stderr capped
	detached       bool
}

// drain reads r to its end, sending whole UTF-8 sequences (a rune split across reads waits for the next read).
func (o *execOutput) drain(r *os.File, typ string, acc *capped, wg *sync.WaitGroup) {
	defer wg.Done()
	defer r.Close()
	buf := make([]byte, 32<<10)
	var pending []byte
	for {
		n, err := r.Read(buf)
		if n > 0 {
			pending = append(pending, buf[:n]...)
			if cut := validPrefix(pending); cut > 0 {
				if !o.deliver(typ, acc, string(pending[:cut])) {
					break
				}
				pending = append(pending[:0], pending[cut:]...)
			}
		}
		if err != nil {
			if len(pending) > 0 {
				o.deliver(typ, acc, strings.ToValidUTF8(string(pending), "\uFFFD"))
			}
			return
		}
	}
	// The call has answered; a job it left running still writes here. Drop what it writes, with a small buffer
	// (a sandbox may leave many such jobs behind).
	small := make([]byte, 512)
	for {
		if _, err := r.Read(small); err != nil {
			return
		}
	}
}

// deliver adds s to the call's output and sends it as an event, unless the call has answered (false).
func (o *execOutput) deliver(typ string, acc *capped, s string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.detached {
		return false
	}
	acc.add(s)
	o.emit(Event{Type: typ, Data: s})
	return true
}

// detach ends the collection and returns what was collected; no event is sent after it returns.
func (o *execOutput) detach() (stdout, stderr string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.detached = true
	return o.stdout.sb.String(), o.stderr.sb.String()
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
