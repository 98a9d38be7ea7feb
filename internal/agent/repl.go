package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/seccomp"
)

// replBootstrap reads the interpreter loop from fd 4 (writeReplPayload) and runs it: the code compiled ahead if this
// interpreter's magic number is the one it was compiled by, else the source, compiled here (~20 ms of CPU). The
// fork child helper that comes with it is left to the loop as _ramify_fork_helper.
const replBootstrap = "import os, marshal, _frozen_importlib_external as _x; f = os.fdopen(4, 'rb'); d = f.read(); f.close(); " +
	"n = int.from_bytes(d[4:8], 'big') if d[:4] == b'RMFY' else -1; " +
	"m = int.from_bytes(d[8 + n:12 + n], 'big') if n >= 0 else 0; _ramify_fork_helper = d[12 + n:12 + n + m] if m else None; " +
	"code = marshal.loads(d[44:8 + n]) if n > 36 and d[8:12] == _x.MAGIC_NUMBER else compile(d[12 + n + m:] if n >= 0 else d, '<ramify-repl>', 'exec'); " +
	"del f, d, n, m, _x, marshal; exec(code)"

// writeReplPayload writes what an interpreter's bootstrap reads (writeBootstrapPayload) for this binary's loop:
// its source, if this binary embeds one compiled from that source, compiled/repl.pyc, and the fork child helper.
func writeReplPayload(w io.Writer) error {
	var pyc io.ReadSeeker
	if f, err := compiled.Open("compiled/repl.pyc"); err == nil {
		defer f.Close()
		pyc, _ = f.(io.ReadSeeker)
	}
	return writeBootstrapPayload(w, replSource, pyc, forkChildHelper)
}

// writeBootstrapPayload writes "RMFY", the length of pyc and pyc (the loop compiled ahead: magic number, SHA-256
// of its source, marshalled code), the length of helper and helper (forkchild.c compiled, which the loop loads at
// its first fork), then src, the loop's source; pyc is left out (length 0) unless compiled from src.
// Everything goes through one 4 KiB buffer, straight from the embedded files: the payload built as one slice
// (~140 KB, kept for reuse) and the copies of the files it was built from were ~0.3 MB of private memory in
// every agent that starts an interpreter.
func writeBootstrapPayload(w io.Writer, src string, pyc io.ReadSeeker, helper []byte) error {
	buf := make([]byte, 4096)
	// Plain readers and writers: io.CopyBuffer would otherwise hand the copy to a ReaderFrom or WriterTo, which
	// allocate buffers or copies of their own (os.File's ReadFrom, strings.Reader's WriteTo).
	type reader struct{ io.Reader }
	type writer struct{ io.Writer }
	var n int64
	if pyc != nil {
		end, err := pyc.Seek(0, io.SeekEnd)
		head := buf[:36]
		if err == nil && end > 36 {
			if _, err = pyc.Seek(0, io.SeekStart); err == nil {
				_, err = io.ReadFull(pyc, head)
			}
			h := sha256.New()
			if err == nil {
				_, err = io.CopyBuffer(writer{h}, reader{strings.NewReader(src)}, buf[36:])
			}
			if err == nil && bytes.Equal(head[4:], h.Sum(nil)) {
				n = end
			}
		}
	}
	if _, err := w.Write(binary.BigEndian.AppendUint32(append(buf[:0], "RMFY"...), uint32(n))); err != nil {
		return err
	}
	if n > 0 {
		if _, err := pyc.Seek(0, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.CopyBuffer(writer{w}, reader{io.LimitReader(pyc, n)}, buf); err != nil {
			return err
		}
	}
	if _, err := w.Write(binary.BigEndian.AppendUint32(buf[:0], uint32(len(helper)))); err != nil {
		return err
	}
	if _, err := w.Write(helper); err != nil {
		return err
	}
	_, err := io.WriteString(w, src) // os.File writes a string without copying it
	return err
}

// repl drives the sandbox's persistent Python interpreter. One call runs at a time.
type repl struct {
	agent *Agent

	turn chan struct{} // held (a value sent) by the one call the interpreter serves: run, fork, session ops

	mu      sync.Mutex // guards the fields below
	conn    net.Conn
	r       *bufio.Reader
	pid     int
	cmd     *exec.Cmd // nil for an attached (forked) interpreter
	sink    func(Event)
	running bool

	syncMu   sync.Mutex
	syncCond *sync.Cond
	synced   map[string]int // per stream, the last run whose fd-level output has been forwarded
	dead     chan struct{}  // closed when the current interpreter's connection fails
	// lost: a call that is not a run found the interpreter dead (killed, out of memory) and dropped it. The
	// next run or call says so (exitedSinceLastCall) instead of starting a fresh interpreter without a word.
	lost bool
	// opDone is closed when the save or fork the interpreter opPid serves ends (tracked); nil when none runs.
	opDone chan struct{}
	opPid  int
}

// exitedSinceLastCall is what a run (or call) says when the interpreter died since the last one.
const exitedSinceLastCall = "the interpreter had exited since the last call (killed?); its state is lost and a fresh interpreter runs the next call"

// lostError is the error of a call (not a run) that needed the interpreter and found it dead, or saw it die: its
// state is lost. The agent's answer says so (Event.Lost), and the server answers such a call with a conflict.
type lostError struct{ msg string }

func (e *lostError) Error() string { return e.msg }

// tasksFullError is a fork that the interpreter could not make: os.fork failed with EAGAIN, its sandbox's tasks
// limit (max_procs) being full.
type tasksFullError struct{ msg string }

func (e *tasksFullError) Error() string { return e.msg }

// isTasksFull reports whether err is a tasksFullError.
func isTasksFull(err error) bool {
	var f *tasksFullError
	return errors.As(err, &f)
}

// isLost reports whether err says the interpreter's state was lost (lostError).
func isLost(err error) bool {
	var l *lostError
	return errors.As(err, &l)
}

// takeLost reports, once, that a call found the interpreter dead since the last run or call.
func (p *repl) takeLost() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	lost := p.lost
	p.lost = false
	return lost
}

func (p *repl) currentPid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// ensure starts an interpreter if none is alive (or waits for a forked one to attach) and returns its pid.
func (p *repl) ensure() (int, error) {
	if pid, ok := p.live(); ok {
		return pid, nil
	}
	a := p.agent
	if a.forked.Load() {
		// Whether or not the token was already taken: attachRepl clears it before it installs the interpreter,
		// and deciding on the token here could start a fresh interpreter in that window.
		select {
		case <-a.attached:
		case <-time.After(30 * time.Second):
			return 0, errors.New("forked interpreter did not attach within 30s")
		}
		if pid, ok := p.live(); ok {
			return pid, nil
		}
		// The forked interpreter has died since it attached: start a fresh one, as for any dead interpreter.
	}
	return p.spawn()
}

// live returns the pid of the connected interpreter, if there is one.
func (p *repl) live() (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid, p.conn != nil
}

func (p *repl) spawn() (int, error) {
	a := p.agent
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	mine := os.NewFile(uintptr(pair[0]), "repl")
	theirs := os.NewFile(uintptr(pair[1]), "repl-peer")
	defer theirs.Close()
	conn, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return 0, err
	}
	// The loop's source comes through a pipe on fd 4, so that ps shows a short command line.
	srcR, srcW, err := os.Pipe()
	if err != nil {
		conn.Close()
		return 0, err
	}
	defer srcR.Close()
	go func() {
		writeReplPayload(srcW) //nolint:errcheck // a failure shows as the interpreter not starting
		srcW.Close()
	}()
	cmd := exec.Command("python3", "-u", "-c", replBootstrap)
	cmd.Env = append(a.environ(nil), "RAMIFY_SECCOMP_BPF="+hex.EncodeToString(a.bpf),
		"RAMIFY_SECCOMP_FLAGS="+strconv.Itoa(seccomp.FilterFlags), interpreterCapsEnv())
	cmd.Env = heapEnv(cmd.Env)
	cmd.Dir = a.workdir("")
	if _, err := os.Stat(cmd.Dir); err != nil {
		cmd.Dir = "/"
	}
	cmd.ExtraFiles = []*os.File{theirs, srcR} // fd 3: the agent's socket, fd 4: the loop's source
	stdout, stderr := &streamWriter{p: p, typ: "stdout"}, &streamWriter{p: p, typ: "stderr"}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true,
		Credential: &syscall.Credential{Uid: 0, Gid: uint32(sandboxGID()), Groups: sandboxGroups}}
	if err := cmd.Start(); err != nil {
		conn.Close()
		return 0, fmt.Errorf("start python3: %w", err)
	}
	go waitExit(cmd) //nolint:errcheck // the exit is seen as EOF on conn
	r := bufio.NewReaderSize(conn, 64<<10)
	// The first message is "ready" with the interpreter's seccomp listener attached.
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, lfd, err := recvFD(conn.(*net.UnixConn))
	conn.SetReadDeadline(time.Time{})
	if err != nil {
		cmd.Process.Kill()
		conn.Close()
		return 0, fmt.Errorf("interpreter did not start: %w", err)
	}
	line = bytes.TrimSpace(line)
	if lfd < 0 {
		cmd.Process.Kill()
		conn.Close()
		return 0, fmt.Errorf("interpreter did not install its seccomp filter: %s", line)
	}
	a.supervise(lfd)
	var ready replMsg
	if json.Unmarshal(line, &ready) != nil || ready.Type != "ready" {
		cmd.Process.Kill()
		conn.Close()
		return 0, fmt.Errorf("interpreter sent %q instead of ready", line)
	}
	p.install(conn, r, cmd.Process.Pid, cmd)
	return cmd.Process.Pid, nil
}

// interpreterHeap is the environment that gives the interpreter's heap transparent huge pages: every Python
// object through glibc's malloc (not pymalloc's 1 MiB arenas, which the kernel cannot back with huge pages),
// and malloc asking for huge pages for its heap (madvise, glibc >= 2.35). A fork copies a huge page's page
// table entry instead of 512 small ones: 5 forks of an interpreter holding 200 MB of dicts, lists and strings
// take ~10 ms of CPU instead of ~100 ms. The price: ~30% more memory for a heap of small objects (malloc's
// per-object header), a little slower allocation, ~2 MiB more per idle interpreter. It needs THP in "madvise"
// or "always" mode (/sys/kernel/mm/transparent_hugepage/enabled); with "never" it changes nothing but the
// allocator. It applies whatever the sandbox's env says: a warm sandbox's interpreter starts before its env is
// known, and one allocator for all keeps fork and memory figures predictable.
var interpreterHeap = [][2]string{{"PYTHONMALLOC", "malloc"}, {"GLIBC_TUNABLES", "glibc.malloc.hugetlb=1"}}

// heapEnv returns env with the interpreterHeap settings in force, and RAMIFY_HEAP_ENV telling the interpreter
// what its os.environ should say for them once started (the sandbox's own values, or nothing): the sandbox's
// environment stays as it was for user code and for the processes it starts.
func heapEnv(env []string) []string {
	sandbox := map[string]*string{}
	for _, kv := range interpreterHeap {
		sandbox[kv[0]] = nil
		env = slices.DeleteFunc(env, func(e string) bool {
			if v, ok := strings.CutPrefix(e, kv[0]+"="); ok {
				sandbox[kv[0]] = &v
				return true
			}
			return false
		})
		env = append(env, kv[0]+"="+kv[1])
	}
	restore, _ := json.Marshal(sandbox)
	return append(env, "RAMIFY_HEAP_ENV="+string(restore))
}

func (p *repl) install(conn net.Conn, r *bufio.Reader, pid int, cmd *exec.Cmd) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conn, p.r, p.pid, p.cmd = conn, r, pid, cmd
	p.dead = make(chan struct{})
	p.syncMu.Lock()
	p.synced = nil // a new interpreter counts its runs afresh
	p.syncMu.Unlock()
}

// dropLost drops the current interpreter, found dead by a call that is not a run: see lost.
func (p *repl) dropLost() {
	p.drop()
	p.mu.Lock()
	p.lost = true
	p.mu.Unlock()
}

// drop forgets the current interpreter, killing it.
func (p *repl) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		p.conn.Close()
	}
	if p.pid > 0 {
		syscall.Kill(p.pid, syscall.SIGKILL)
	}
	p.conn, p.r, p.pid, p.cmd = nil, nil, 0, nil
}

// attachRepl adopts a forked interpreter that connected with the expected token.
func (a *Agent) attachRepl(c net.Conn, r *bufio.Reader, req Request) bool {
	a.mu.Lock()
	ok := a.token != "" && req.Token == a.token
	if ok {
		a.token = ""
	}
	a.mu.Unlock()
	w := &eventWriter{w: bufio.NewWriter(c)}
	if !ok {
		w.emit(Event{Type: "error", Message: "unexpected interpreter"})
		return false
	}
	// The interpreter's fd 1 and 2 are still its parent's pipes, read by the parent sandbox's agent: its fd-level
	// output (subprocesses, C code) would reach the parent's runs, or nobody, and fail once the parent is gone.
	// It gets pipes of this agent's with the answer and puts them on fd 1 and 2.
	out, err := a.repl.attachStreams()
	if err != nil {
		w.emit(Event{Type: "error", Message: "output pipes: " + err.Error()})
		return false
	}
	line, _ := json.Marshal(Event{Type: "ok"})
	_, _, err = c.(*net.UnixConn).WriteMsgUnix(append(line, '\n'), unix.UnixRights(int(out[0].Fd()), int(out[1].Fd())), nil)
	out[0].Close()
	out[1].Close()
	if err != nil {
		return false
	}
	a.repl.install(c, r, req.Pid, nil)
	close(a.attached)
	return true
}

// attachStreams makes the stdout and stderr pipes of an attaching interpreter: it returns their write ends
// (the caller sends and closes them) and forwards what comes out of the read ends to the current run, as for
// an interpreter it started.
func (p *repl) attachStreams() ([2]*os.File, error) {
	var ends [2]*os.File
	for i, typ := range []string{"stdout", "stderr"} {
		r, w, err := os.Pipe()
		if err != nil {
			if i == 1 {
				ends[0].Close()
			}
			return ends, err
		}
		ends[i] = w
		go func() {
			io.Copy(&streamWriter{p: p, typ: typ}, r) //nolint:errcheck // ends when every writer has closed
			r.Close()
		}()
	}
	return ends, nil
}

// streamWriter forwards the interpreter's fd 1/2 output (subprocesses, C extensions) to the current run. At the
// end of each run the interpreter writes a sync marker carrying the run's execution count on both pipes; the
// writer strips it and records it, so that the run can wait until every byte written before it was forwarded.
type streamWriter struct {
	p       *repl
	typ     string
	pending []byte // a possible start of a marker, held back until the next write
}

var syncPrefix = []byte("\x00ramify-sync:")

// maxSyncDigits bounds a marker's count: a marker is the prefix, 1 to maxSyncDigits ASCII digits and a NUL;
// anything else that starts with the prefix is output.
const maxSyncDigits = 20

func (s *streamWriter) Write(b []byte) (int, error) {
	data := append(s.pending, b...)
	s.pending = nil
	for len(data) > 0 {
		i := bytes.Index(data, syncPrefix)
		if i < 0 {
			// Hold back a tail that could be the start of a marker split across writes.
			keep := 0
			for k := min(len(syncPrefix)-1, len(data)); k > 0; k-- {
				if bytes.HasSuffix(data, syncPrefix[:k]) {
					keep = k
					break
				}
			}
			s.forward(data[:len(data)-keep])
			s.pending = append([]byte(nil), data[len(data)-keep:]...)
			break
		}
		s.forward(data[:i])
		rest := data[i+len(syncPrefix):]
		k := 0 // digits after the prefix
		for k < len(rest) && k <= maxSyncDigits && rest[k] >= '0' && rest[k] <= '9' {
			k++
		}
		if k == len(rest) && k <= maxSyncDigits {
			s.pending = append([]byte(nil), data[i:]...) // a marker split across writes
			break
		}
		if k == 0 || k > maxSyncDigits || rest[k] != 0 {
			// Not a marker (sandbox code wrote the prefix): plain output, so that it can neither hold back
			// the output after it nor swallow the interpreter's own marker.
			s.forward(data[i : i+1])
			data = data[i+1:]
			continue
		}
		n, _ := strconv.Atoi(string(rest[:k]))
		s.p.noteSync(s.typ, n)
		data = rest[k+1:]
	}
	return len(b), nil
}

func (s *streamWriter) forward(b []byte) {
	if len(b) == 0 {
		return
	}
	s.p.mu.Lock()
	sink := s.p.sink
	s.p.mu.Unlock()
	if sink != nil {
		sink(Event{Type: s.typ, Data: string(b)})
	}
}

// noteSync records that stream typ has forwarded everything up to the end of run n.
func (p *repl) noteSync(typ string, n int) {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	if p.synced == nil {
		p.synced = map[string]int{}
	}
	p.synced[typ] = n
	if p.syncCond != nil {
		p.syncCond.Broadcast()
	}
}

// waitSync waits (a bounded time) until both streams have forwarded the fd-level output of run n.
func (p *repl) waitSync(n int, limit time.Duration) {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	if p.syncCond == nil {
		p.syncCond = sync.NewCond(&p.syncMu)
	}
	deadline := time.Now().Add(limit)
	t := time.AfterFunc(limit, func() {
		p.syncMu.Lock()
		p.syncCond.Broadcast()
		p.syncMu.Unlock()
	})
	defer t.Stop()
	for (p.synced["stdout"] < n || p.synced["stderr"] < n) && time.Now().Before(deadline) {
		p.syncCond.Wait()
	}
}

func (p *repl) send(v any) error { return p.sendFile(v) }

// sendFile sends one request line, with descriptors fds attached.
func (p *repl) sendFile(v any, fds ...int) error {
	b, _ := json.Marshal(v)
	b = append(b, '\n')
	p.mu.Lock()
	conn := p.conn
	p.mu.Unlock()
	if conn == nil {
		return errors.New("no interpreter")
	}
	if len(fds) > 0 {
		_, _, err := conn.(*net.UnixConn).WriteMsgUnix(b, unix.UnixRights(fds...), nil)
		return err
	}
	_, err := conn.Write(b)
	return err
}

func (p *repl) recv() (replMsg, error) {
	var m replMsg
	line, err := readLine(p.r, maxRequest)
	if err != nil {
		return m, err
	}
	err = json.Unmarshal(line, &m)
	return m, err
}

// run executes code and returns the terminal "result" event; output events go to emit as they arrive.
// When ctx ends first (the caller went away), the code is interrupted as a timeout interrupts it: SIGINT, then
// SIGKILL if it does not stop, so that an abandoned call does not keep the interpreter busy for the next one.
// env, if set, is set in the interpreter's os.environ for this run only (restored after it).
func (p *repl) run(ctx context.Context, code string, env map[string]string, timeoutS float64, emit func(Event)) Event {
	msg := map[string]any{"op": "run", "code": code}
	if len(env) > 0 {
		msg["env"] = env
	}
	return p.runMsg(ctx, msg, timeoutS, emit)
}

// warm has the interpreter run a cell that leaves no trace in its session (repl.py's _warm) through the whole
// path of a run, here and there: a fork child made ahead of its fork takes its first run's costs while it waits.
func (p *repl) warm(ctx context.Context) error {
	ev := p.runMsg(ctx, map[string]any{"op": "run", "warm": true}, 0, func(Event) {})
	if ev.Error != nil {
		return fmt.Errorf("%s: %s", ev.Error.Name, ev.Error.Value)
	}
	return nil
}

// runMsg sends msg, a run request, and returns the terminal "result" event; see run.
func (p *repl) runMsg(ctx context.Context, msg map[string]any, timeoutS float64, emit func(Event)) Event {
	// The timeout counts from the call's arrival: a call queued behind a long one fails at its own deadline, it
	// does not inherit the wait of the one ahead of it.
	arrived, limitS := time.Now(), timeoutS // limitS: the caller's timeout, for the messages
	if ev, ok := p.waitTurn(ctx, timeoutS); !ok {
		return ev
	}
	defer p.endTurn()
	if timeoutS > 0 {
		timeoutS -= time.Since(arrived).Seconds()
		if timeoutS <= 0 {
			return timeoutBeforeRun(timeoutS + time.Since(arrived).Seconds())
		}
	}
	if p.takeLost() {
		return died(exitedSinceLastCall)
	}
	if _, err := p.ensure(); err != nil {
		return died(err.Error())
	}
	var out, errOut capped
	out.limit, errOut.limit = outputLimit, outputLimit
	var results resultList
	var sinkMu sync.Mutex
	sink := func(ev Event) {
		sinkMu.Lock()
		if ev.Type == "stdout" {
			out.add(ev.Data)
		} else {
			errOut.add(ev.Data)
		}
		sinkMu.Unlock()
		emit(ev)
	}
	p.mu.Lock()
	p.sink, p.running = sink, true
	pid := p.pid
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.sink, p.running = nil, false
		p.mu.Unlock()
	}()

	var timedOut bool
	var timer, killTimer *time.Timer
	// interrupt is the one way a run's code is interrupted (the call's timeout, the caller going away, POST
	// /interrupt ending ctx): at most one SIGINT per run, and killTimer says whether it was sent.
	interrupt := func(timeout bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.running && p.pid == pid && killTimer == nil {
			timedOut = timeout
			syscall.Kill(pid, syscall.SIGINT)
			// Code stuck in C that ignores the interrupt: kill the interpreter after a grace period.
			killTimer = time.AfterFunc(10*time.Second, func() { syscall.Kill(pid, syscall.SIGKILL) })
		}
	}
	if timeoutS > 0 {
		timer = time.AfterFunc(time.Duration(timeoutS*float64(time.Second)), func() { interrupt(true) })
	}
	abandoned := context.AfterFunc(ctx, func() { interrupt(false) })
	stop := func() {
		abandoned()
		p.mu.Lock()
		p.running = false
		if timer != nil {
			timer.Stop()
		}
		if killTimer != nil {
			killTimer.Stop()
		}
		p.mu.Unlock()
	}

	if err := p.send(msg); err != nil {
		stop()
		p.drop()
		return died(exitedSinceLastCall)
	}
	for {
		m, err := p.recv()
		if err != nil {
			stop()
			p.drop()
			ev := died("the interpreter process died (killed, or out of memory); a fresh one starts on the next call")
			p.mu.Lock()
			to := timedOut
			p.mu.Unlock()
			if to {
				ev.Error.Name = "TimeoutError"
				ev.Error.Value = fmt.Sprintf("execution exceeded %gs and did not stop on interrupt; the interpreter was restarted", limitS)
			} else if errors.Is(context.Cause(ctx), ErrInterrupted) {
				ev.Error.Value = "interrupted, and did not stop within the grace period: the interpreter was killed; its state is lost and a fresh one runs the next call"
				ev.WasInterrupted = true
			}
			ev.Stdout, ev.Stderr, ev.Results = out.sb.String(), errOut.sb.String(), results.list
			return ev
		}
		switch m.Type {
		case "stdout", "stderr":
			sink(Event{Type: m.Type, Data: m.Data})
		case "display_data", "execute_result":
			if r, ok := results.add(m.Type, m.Bundle); ok && m.Type == "display_data" {
				emit(Event{Type: m.Type, Results: []Result{r}})
			}
		case "result":
			stop()
			p.mu.Lock()
			to, sigint := timedOut, killTimer != nil
			p.mu.Unlock()
			if sigint {
				p.discardSigint()
			}
			if to && m.Error != nil && m.Error.Name == "KeyboardInterrupt" {
				m.Error.Name = "TimeoutError"
				m.Error.Value = fmt.Sprintf("execution exceeded %gs and was interrupted", limitS)
				// The traceback shows where the code was interrupted; its last line says why.
				m.Error.Traceback = strings.TrimRight(m.Error.Traceback, "\n") + "\nTimeoutError: " + m.Error.Value + "\n"
			}
			wasInterrupted := errors.Is(context.Cause(ctx), ErrInterrupted) && !to
			// Let the run's fd-level output (read from the pipes by other goroutines) land before answering:
			// every interpreter's fd 1 and 2 are this agent's pipes (a started one's, or those an attaching
			// one is given), and it ends each run with sync markers on them.
			p.waitSync(m.ExecutionCount, 2*time.Second)
			capResult(&m)
			sinkMu.Lock()
			ev := Event{Type: "result", Stdout: out.sb.String(), Stderr: errOut.sb.String(), Value: m.Value, Error: m.Error,
				ExecutionCount: m.ExecutionCount, WasInterrupted: wasInterrupted, Results: results.list}
			sinkMu.Unlock()
			return ev
		}
	}
}

// discardSigint has the interpreter drop a SIGINT that an interrupt of the run that just ended left pending in
// it (repl.py's discard_sigint), so that it cannot hit the next run. The interpreter blocks SIGINT except while a
// cell's code runs, and drops one pending when the code ends (_block_sigint); but the agent counts the run as
// running until it has read its result, and an interrupt sent between the two (the caller went away, the
// timeout or POST /interrupt came, just as the cell ended) stayed pending, blocked, until the next cell let
// SIGINT through: that cell failed at once with a KeyboardInterrupt, its code not run.
//
// The order makes it exact. runMsg calls it once stop() has set running to false, and before endTurn: interrupt
// sends its SIGINT holding p.mu and only while running, so every SIGINT aimed at this run was sent (kill
// returned: the signal is pending in the interpreter, which blocks it) before the request below is written, and
// the interpreter, which reads requests in order, drops it before anything else; an interrupt sent later finds
// running false and sends nothing. The next run sets running (and so may be interrupted) only once it holds the
// turn, after this exchange is over: an interrupt aimed at it is never dropped here. A run the agent did not
// interrupt costs nothing more.
//
// An interpreter found dead here is dropped, and the next run or call says so (lost), as one killed after its
// result was read. An interpreter that does not know the op (one started by an older binary and kept across an
// upgrade) answers with an error, which changes nothing.
func (p *repl) discardSigint() {
	p.exchange(map[string]any{"op": "discard_sigint"}, nil) //nolint:errcheck // see above
}

// resultList collects a call's rich results within resultsLimit: one that does not fit becomes a text/plain
// note (repl.py keeps to the same limit; this holds the agent's events to maxEvent whatever the interpreter sends).
type resultList struct {
	list []Result
	size int
}

func (l *resultList) add(typ string, data map[string]json.RawMessage) (Result, bool) {
	r := Result{Type: typ, Data: data}
	if _, ok := data["text/plain"]; !ok { // repl.py always sends it; the API promises it
		r.Data = maps.Clone(data)
		if r.Data == nil {
			r.Data = map[string]json.RawMessage{}
		}
		r.Data["text/plain"] = json.RawMessage(`""`)
	}
	if l.size+r.size() > resultsLimit {
		note, _ := json.Marshal(fmt.Sprintf("[result left out: its %d bytes would take this cell's results past their limit of %d MiB]",
			r.size(), resultsLimit>>20))
		r.Data = map[string]json.RawMessage{"text/plain": note}
		if l.size+r.size() > resultsLimit {
			return r, false
		}
	}
	l.size += r.size()
	l.list = append(l.list, r)
	return r, true
}

// capResult bounds a result's value, error value and traceback (repl.py bounds them too, in its own encoding,
// which escapes other characters than the agent's), so that the result event stays within maxEvent.
func capResult(m *replMsg) {
	if m.Value != nil {
		v := capField(*m.Value, fieldLimit)
		m.Value = &v
	}
	if m.Error != nil {
		m.Error.Name = capField(m.Error.Name, 8<<10)
		m.Error.Value = capField(m.Error.Value, fieldLimit)
		m.Error.Traceback = capField(m.Error.Traceback, fieldLimit)
	}
}

// waitTurn waits until the interpreter is free for a run. It gives up, with the result the call answers, when
// ctx ends (an interrupt, or the caller went away) or after timeoutS (> 0) seconds.
func (p *repl) waitTurn(ctx context.Context, timeoutS float64) (Event, bool) {
	select {
	case p.turn <- struct{}{}:
		return Event{}, true
	default:
	}
	var deadline <-chan time.Time
	if timeoutS > 0 {
		t := time.NewTimer(time.Duration(timeoutS * float64(time.Second)))
		defer t.Stop()
		deadline = t.C
	}
	select {
	case p.turn <- struct{}{}:
		return Event{}, true
	case <-deadline:
		return timeoutBeforeRun(timeoutS), false
	case <-ctx.Done():
		ev := Event{Type: "result", Error: &ExecError{Name: "KeyboardInterrupt",
			Value: "interrupted while waiting for the interpreter (busy with an earlier call): the code did not run"}}
		ev.WasInterrupted = errors.Is(context.Cause(ctx), ErrInterrupted)
		return ev, false
	}
}

func (p *repl) endTurn() { <-p.turn }

func timeoutBeforeRun(timeoutS float64) Event {
	return Event{Type: "result", Error: &ExecError{Name: "TimeoutError", Value: fmt.Sprintf(
		"waited %gs for the interpreter, busy with an earlier call: the code did not run", timeoutS)}}
}

func died(msg string) Event {
	return Event{Type: "result", Error: &ExecError{Name: "InterpreterDied", Value: msg}}
}

// call sends one request that is not a code run (configure, fork, snapshot, restore) to the interpreter,
// starting one first if needed, and returns its result. A dead interpreter is dropped.
func (p *repl) call(req map[string]any) (replMsg, error) { return p.callFile(req) }

// callFile is call with descriptors fds sent along with the request.
func (p *repl) callFile(req map[string]any, fds ...int) (replMsg, error) {
	return p.callFileOn(req, nil, fds...)
}

// callFileOn is callFile with on given every message the interpreter sends before its result.
func (p *repl) callFileOn(req map[string]any, on func(replMsg), fds ...int) (replMsg, error) {
	p.turn <- struct{}{}
	defer p.endTurn()
	if p.takeLost() {
		return replMsg{}, &lostError{exitedSinceLastCall}
	}
	if _, err := p.ensure(); err != nil {
		return replMsg{}, err
	}
	return p.exchange(req, on, fds...)
}

// forkHooks asks the running interpreter whether its session registered at-fork handlers that children made
// ahead of a fork must not run (repl.py's fork_check). Made for the server's own purposes, it neither starts
// an interpreter nor takes the notice of one found dead (lost), which is the next run's to give.
func (p *repl) forkHooks() (bool, error) {
	p.turn <- struct{}{}
	defer p.endTurn()
	if _, live := p.live(); !live { // none started, or one found dead (lost)
		return false, errors.New("no interpreter running")
	}
	m, err := p.exchange(map[string]any{"op": "fork_check"}, nil)
	return m.ForkHooks, err
}

// exchange sends req to the interpreter (the caller holds its turn) and waits for its result, giving on (if
// set) every other message it sends meanwhile. An interpreter found dead is dropped, and the next run or call
// says so (lost).
func (p *repl) exchange(req map[string]any, on func(replMsg), fds ...int) (replMsg, error) {
	if err := p.sendFile(req, fds...); err != nil {
		// Writing to it failed: it had exited since the last call (killed, out of memory).
		p.dropLost()
		return replMsg{}, &lostError{exitedSinceLastCall}
	}
	for {
		m, err := p.recv()
		if err != nil {
			p.dropLost()
			return replMsg{}, &lostError{fmt.Sprintf("the interpreter died during %s (killed, or out of memory: %v); its state is lost and a fresh interpreter runs the next call", req["op"], err)}
		}
		if m.Type == "result" {
			if m.Error != nil {
				return m, fmt.Errorf("%s: %s: %s", req["op"], m.Error.Name, m.Error.Value)
			}
			return m, nil
		}
		if on != nil {
			on(m)
		}
	}
}

// configure sets the interpreter's environment and working directory. holds is false when the interpreter
// imported packages ahead (preload) that an import would not find the same with them.
func (p *repl) configure(env map[string]string, cwd string) (holds bool, err error) {
	m, err := p.call(map[string]any{"op": "configure", "env": env, "cwd": cwd})
	return m.PreloadHolds == nil || *m.PreloadHolds, err
}

// fork asks the interpreter to fork once per target; it returns the children's pids (family PID namespace).
func (p *repl) fork(targets []ForkTarget, files []*os.File, handover bool) ([]int, error) {
	if handover && len(targets) != 1 {
		return nil, fmt.Errorf("a handover has one target, not %d", len(targets))
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	req := map[string]any{"op": "fork", "targets": targets}
	if handover {
		req["handover"] = true
	}
	m, err := p.tracked(func() (replMsg, error) {
		return p.callFile(req, fds...)
	})
	if err != nil && m.Error != nil && m.Error.Name == "BlockingIOError" {
		return nil, &tasksFullError{"the sandbox's tasks limit (max_procs) is full: its interpreter could not fork (" + m.Error.Value + "); end some of its processes and fork again"}
	}
	if err == nil && handover {
		p.release()
	}
	return m.Pids, err
}

// release forgets the current interpreter without ending it: it has handed itself over to another sandbox's
// agent (fork with handover).
func (p *repl) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		p.conn.Close()
	}
	p.conn, p.r, p.pid, p.cmd = nil, nil, 0, nil
}

// session runs the interpreter's snapshot or restore op, on the session stream sent with req or (restore of an
// older snapshot) on req.Dir; its answer lists what it could not handle (and, for a snapshot, Preload). A
// snapshot with req.Budget passes the interpreter the pipe its saving copy waits on, and gives on the copy's pid
// (repl.py's save_copy message) as soon as it is forked.
func (p *repl) session(op string, req Request, on func(pid int)) (replMsg, error) {
	if req.Stream && req.Budget && len(req.files) == 2 {
		told := false
		return p.callFileOn(map[string]any{"op": op, "stream": true, "budget": true}, func(m replMsg) {
			// Once, and only a child of this interpreter: the server moves the process it names out of the
			// sandbox's cgroup, and kills what is left there when the save ends.
			if m.Type != "save_copy" || told || on == nil || !p.isChild(m.Pid) {
				return
			}
			told = true
			on(m.Pid)
		}, int(req.file.Fd()), int(req.files[1].Fd()))
	}
	if req.Stream {
		return p.callFile(map[string]any{"op": op, "stream": true, "sum": req.Sum}, int(req.file.Fd()))
	}
	return p.call(map[string]any{"op": op, "dir": req.Dir})
}

// isChild reports whether pid is a child of the running interpreter.
func (p *repl) isChild(pid int) bool {
	parent := p.currentPid()
	if pid <= 0 || parent <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	st, ok := parseStat(pid, b)
	return ok && st.ppid == parent
}

// tracked runs op, a save or a fork by the interpreter, so that replaceStuck can find it.
func (p *repl) tracked(op func() (replMsg, error)) (replMsg, error) {
	done := make(chan struct{})
	p.mu.Lock()
	p.opDone, p.opPid = done, p.pid
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		if p.opDone == done {
			p.opDone, p.opPid = nil, 0
		}
		p.mu.Unlock()
		close(done)
	}()
	return op()
}

// replaceStuck kills the interpreter if the save or fork it serves (tracked) has not ended within grace: the
// server gave up on it for not answering (code in the sandbox holds the GIL in C code and never lets go), and
// every later call would wait behind it for ever. The sandbox's next call then gets a fresh interpreter, which
// says the state was lost. A save's stream is closed by then, so a live interpreter answers at once. It reports
// whether it killed one.
func (p *repl) replaceStuck(grace time.Duration) bool {
	p.mu.Lock()
	done, pid := p.opDone, p.opPid
	p.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	case <-time.After(grace):
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.opDone != done || pid <= 0 || p.pid != pid {
		return false
	}
	syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // gone already: the op answers anyway
	return true
}

// preload imports modules in the interpreter (see Client.Preload).
func (p *repl) preload(modules []string) error {
	_, err := p.call(map[string]any{"op": "preload", "modules": modules})
	return err
}
