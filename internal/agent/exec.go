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
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/seccomp"
)

// outputGrace is how long exec waits, once its command's main process has exited, for output still in the
// pipes (or written by processes the command left running) before it answers.
const outputGrace = 150 * time.Millisecond

// outputCatchUp bounds how long exec waits, once the main process has exited, for the agent to read what was
// already in the pipes then (written before the exit): on a loaded machine the reader may not have run for a
// while, and that output is the command's, not a background job's.
const outputCatchUp = 10 * time.Second

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
	run, failed := a.startCommand(argv, req)
	if run == nil {
		return failed
	}
	defer run.closeStdin()
	out := run.collect(emit)
	werr, timedOut := run.wait(ctx, req.TimeoutS)
	stdout, stderr := out.finish()
	return Event{Type: "exit", ExitCode: exitCode(werr), TimedOut: timedOut, Stdout: stdout, Stderr: stderr,
		WasInterrupted: !timedOut && errors.Is(context.Cause(ctx), ErrInterrupted)}
}

// execRun is one started exec command.
type execRun struct {
	cmd        *exec.Cmd
	token      string   // the call's ExecIDEnv value
	outR, errR *os.File // the read ends of the command's stdout and stderr
	stdinW     *os.File // the write end of its stdin, or nil
}

// startCommand starts argv from the spawner thread with its output on pipes of the agent's own (not through
// os/exec's copying, so that Wait returns when the main process exits, whoever else still holds the pipes).
// A command that cannot start gives a nil run and its "exit" event.
func (a *Agent) startCommand(argv []string, req Request) (*execRun, Event) {
	cmd := exec.Command(argv[0], argv[1:]...)
	// A token of this call in the command's environment, inherited by whatever it starts: a timeout finds by it
	// the processes that escaped the tracker (see procTree).
	run := &execRun{cmd: cmd, token: execToken()}
	cmd.Env = append(a.environ(req.Env), ExecIDEnv+"="+run.token)
	cmd.Dir = a.workdir(req.Cwd)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var ours, theirs []*os.File // pipe ends kept by the agent, and given to the command
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	pipe := func() (r, w *os.File, err error) {
		if r, w, err = os.Pipe(); err == nil {
			theirs = append(theirs, w)
			ours = append(ours, r)
		}
		return r, w, err
	}
	var err error
	if run.outR, cmd.Stdout, err = pipe(); err == nil {
		run.errR, cmd.Stderr, err = pipe()
	}
	if err == nil && req.Stdin != "" {
		var r *os.File
		if r, run.stdinW, err = os.Pipe(); err == nil {
			cmd.Stdin = r
			theirs = append(theirs, r)
			ours = append(ours, run.stdinW)
		}
	}
	if err != nil {
		closeAll(ours)
		closeAll(theirs)
		return nil, Event{Type: "error", Message: err.Error()}
	}
	err = a.startFiltered(cmd)
	closeAll(theirs)
	if err != nil {
		closeAll(ours)
		msg := err.Error()
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return nil, Event{Type: "exit", ExitCode: 127, Stderr: msg + "\n"}
		}
		if errors.Is(err, unix.EAGAIN) {
			msg += " (the sandbox's tasks limit, max_procs, is full: end some of its processes)"
		}
		return nil, Event{Type: "exit", ExitCode: 126, Stderr: msg + "\n"}
	}
	os.WriteFile("/proc/"+itoa(cmd.Process.Pid)+"/oom_score_adj", []byte("500"), 0) //nolint:errcheck // best effort
	if run.stdinW != nil {
		go func() {
			run.stdinW.Write([]byte(req.Stdin)) //nolint:errcheck // the command may not read it all
			run.stdinW.Close()
		}()
	}
	return run, Event{}
}

// closeStdin closes the command's stdin when the call ends: a job left running that holds it and never reads
// it cannot keep the writer blocked.
func (r *execRun) closeStdin() {
	if r.stdinW != nil {
		r.stdinW.Close()
	}
}

// collect starts reading the command's output: events go to emit until the call answers (execOutput.finish).
func (r *execRun) collect(emit func(Event)) *execOutput {
	out := &execOutput{emit: emit, files: [2]*os.File{r.outR, r.errR}}
	out.stdout.limit, out.stderr.limit = outputLimit, outputLimit
	out.pipes.Add(2)
	go out.drain(r.outR, "stdout", &out.stdout, &out.read[0])
	go out.drain(r.errR, "stderr", &out.stderr, &out.read[1])
	return out
}

// wait waits for the command's main process to exit. At the timeout (timeoutS > 0) or when ctx is done it kills
// everything the command started first (see procTree), which only a call that can end before its command needs
// to track.
func (r *execRun) wait(ctx context.Context, timeoutS float64) (werr error, timedOut bool) {
	var timeout <-chan time.Time
	if timeoutS > 0 {
		t := time.NewTimer(time.Duration(timeoutS * float64(time.Second)))
		defer t.Stop()
		timeout = t.C
	}
	if timeout == nil && ctx.Done() == nil {
		return waitExit(r.cmd), false
	}
	// Before the command can be reaped: the tree reads its start time now (see newProcTree).
	tree := newProcTree("/proc", r.cmd.Process.Pid, r.token)
	waited := make(chan error, 1)
	go func() { waited <- waitExit(r.cmd) }()
	stopTracking := tree.track()
	defer stopTracking()
	select {
	case werr = <-waited:
		return werr, false
	case <-timeout:
		timedOut = true
	case <-ctx.Done():
	}
	stopTracking()
	tree.kill()
	return <-waited, timedOut
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

// execOutput collects and forwards one exec's output until the call answers (finish); after that its pipes are
// still read, for processes the command left running, and what they write is dropped.
type execOutput struct {
	emit  func(Event)
	pipes sync.WaitGroup  // one per pipe, done at its end
	files [2]*os.File     // the read ends of stdout and stderr
	read  [2]atomic.Int64 // bytes read from each so far

	mu             sync.Mutex
	stdout, stderr capped
	detached       bool
}

// finish, called once the main process has exited, takes what is left in the pipes, waiting at most outputGrace
// for output still on its way (the pipes end at once unless jobs left running hold them), and ends the
// collection: it returns what was collected, and no event is sent after it returns.
func (o *execOutput) finish() (stdout, stderr string) {
	drained := make(chan struct{})
	go func() {
		o.pipes.Wait()
		close(drained)
	}()
	// What the pipes held when the main process exited is its output: wait until it has been read.
	var target [2]int64
	for i, f := range o.files {
		target[i] = o.read[i].Load() + queuedBytes(f)
	}
	caughtUp := func() bool { return o.read[0].Load() >= target[0] && o.read[1].Load() >= target[1] }
	catchUp := time.NewTimer(outputCatchUp)
	tick := time.NewTicker(2 * time.Millisecond)
wait:
	for !caughtUp() {
		select {
		case <-drained:
			break wait
		case <-catchUp.C:
			break wait
		case <-tick.C:
		}
	}
	catchUp.Stop()
	tick.Stop()
	grace := time.NewTimer(outputGrace)
	select {
	case <-drained:
	case <-grace.C:
	}
	grace.Stop()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.detached = true
	return o.stdout.sb.String(), o.stderr.sb.String()
}

// drain reads r to its end, sending whole UTF-8 sequences (a rune split across reads waits for the next read).
func (o *execOutput) drain(r *os.File, typ string, acc *capped, read *atomic.Int64) {
	defer o.pipes.Done()
	defer r.Close()
	buf := make([]byte, 32<<10)
	var pending []byte
	for {
		n, err := r.Read(buf)
		read.Add(int64(n))
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
	discard(r)
}

// discard reads r to its end and drops what it reads: the call has answered, and a job it left running still
// writes to its output. The bytes are spliced to /dev/null inside the kernel, a pipe's worth per system call,
// so that a chatty job costs the agent little, and no buffer is held per job (a sandbox may leave many).
func discard(r *os.File) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY|syscall.O_CLOEXEC, 0)
	rc, err2 := r.SyscallConn()
	if err == nil && err2 == nil {
		defer null.Close()
		for {
			var n int64
			var serr error
			err := rc.Read(func(fd uintptr) bool {
				n, serr = unix.Splice(int(fd), nil, int(null.Fd()), nil, 1<<20, unix.SPLICE_F_NONBLOCK)
				return !errors.Is(serr, unix.EAGAIN) // false: wait until the pipe is readable
			})
			if err != nil {
				return // closed
			}
			if serr != nil {
				break // splice refused (EINVAL): read instead
			}
			if n == 0 {
				return // every writer is gone
			}
		}
	}
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

// runSpawner locks an OS thread, gives it the sandbox's group (see sandboxGID), reduces its capabilities to
// UserCaps with no_new_privs, installs the sandbox's
// seccomp filter on it (its listener goes to the family init) and starts commands from it for the rest of the
// agent's life. Only this thread is filtered and confined: the agent's own signals (timeouts) and the interpreter,
// which confines itself and installs a filter of its own, start elsewhere.
func (a *Agent) runSpawner() error {
	ready := make(chan error, 1)
	a.spawn = make(chan func())
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread carries the filter and dies with the agent
		if err := joinSandboxGroup(); err != nil {
			ready <- err
			return
		}
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

// queuedBytes is how many bytes pipe f holds unread (0 if it cannot tell, e.g. f is closed).
func queuedBytes(f *os.File) int64 {
	if f == nil {
		return 0
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	var n int
	rc.Control(func(fd uintptr) { //nolint:errcheck // a closed file: nothing queued to wait for
		n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) // FIONREAD
	})
	return int64(n)
}
