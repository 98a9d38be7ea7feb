package agent

import (
	"bufio"
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime/debug"
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

//go:embed repl.py
var replSource string

// compiled holds repl.py compiled ahead, when make build could (compiled/README.md).
//
//go:embed all:compiled
var compiled embed.FS

// Config is what the family init passes to a new agent (as JSON in argv[2]).
type Config struct {
	Hostname string `json:"hostname"`
	// ReplToken, when set, means the interpreter will not be started fresh: a forked interpreter will attach
	// with this token (fork children).
	ReplToken string `json:"repl_token,omitempty"`
}

// fdRootMount is the descriptor of the detached overlay mount (the sandbox's root file system) a new agent
// receives from the family init.
const fdRootMount = 3

// setupMemoryLimit bounds the agent's heap while its collector is off, until its sandbox is started.
const setupMemoryLimit = 32 << 20

// unstartedAgentLimit is how long an agent waits for its "start" before it concludes its server is gone.
const unstartedAgentLimit = 2 * time.Minute

// fdInit is the agent's end of a socketpair to the family init, over which it hands seccomp listeners.
const fdInit = 4

// Main is the agent process's entry point (`ramify __agent <config-json>`). It runs as root in the family's
// user namespace, in fresh mount, network, UTS and IPC namespaces created by the family init.
//
// With `--spare` in place of the config, the agent is a spare, started before any sandbox needs it so that a
// fork does not wait for a process to start: it waits on descriptor 3, a socket from the init, for its config
// and its root mount, then carries on as any agent. It exits quietly if the init closes the socket instead.
func Main(args []string) error {
	if len(args) < 1 {
		return errors.New("agent: missing config")
	}
	if err := HardenSelf(3); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	reserveThreads(ReservedThreads) // before anything of the sandbox's can fill its tasks limit (threads.go)
	// Until its sandbox is started the agent's heap holds set-up garbage only (its config, the root's set-up, the
	// interpreter's attach): collecting it as it grows (GOGC=50, from the init) put several GC cycles on the path
	// of the fork or create that claims the agent, ~1.6 ms of CPU per child. The collector waits until the start
	// (bounded by a memory limit meanwhile) and a moment after it.
	gcPercent := debug.SetGCPercent(-1)
	debug.SetMemoryLimit(setupMemoryLimit)
	if args[0] == ConfigFromInit {
		// The config (with the fork token) comes as the first message on the init channel, not on the command
		// line, which every process of the family can read.
		cfg, err := readInitConfig()
		if err != nil {
			return err
		}
		args = []string{cfg}
	}
	a := &Agent{log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), attached: make(chan struct{}), gcPercent: gcPercent}
	a.sup = seccomp.NewSupervisor("/proc", a.log)
	if f := os.NewFile(fdInit, "init"); f != nil {
		if c, err := net.FileConn(f); err == nil {
			a.toInit, _ = c.(*net.UnixConn)
		}
		f.Close()
	}
	staged := args[0] == SpareArg
	var ln net.Listener
	if staged {
		// What does not depend on the sandbox is done before the claim, off the path of the fork that claims it,
		// listening included: the claiming server's first ping waits in the socket's backlog until the agent
		// serves, where it would otherwise poll until the socket appears.
		if err := a.prepare(); err != nil {
			return err
		}
		var err error
		if ln, err = listen(); err != nil {
			return err
		}
		cfg, err := awaitClaim()
		if err != nil {
			if errors.Is(err, errNotClaimed) {
				return nil
			}
			return err
		}
		args = []string{cfg}
	}
	var cfg Config
	if err := json.Unmarshal([]byte(args[0]), &cfg); err != nil {
		return fmt.Errorf("agent: config: %w", err)
	}
	if !staged {
		if err := a.prepare(); err != nil {
			return err
		}
	}
	// host= lets the server file the line under this sandbox (see runtime/namespaces logs.go). Nothing else
	// reads a.log yet: the spawner thread uses it only while it starts (prepare).
	a.log = a.log.With("host", cfg.Hostname)
	a.token = cfg.ReplToken
	a.forked.Store(cfg.ReplToken != "")
	if err := finishRoot(cfg); err != nil {
		return fmt.Errorf("agent: set up root: %w", err)
	}
	if ln == nil {
		var err error
		if ln, err = listen(); err != nil {
			return err
		}
	}
	log := a.log
	// The server starts every sandbox right after spawning its agent; an agent never started belongs to a
	// server that died mid-create, and nothing will ever use or find it: it exits (and its family init with it).
	time.AfterFunc(unstartedAgentLimit, func() {
		a.mu.Lock()
		started := a.started
		a.mu.Unlock()
		if !started {
			log.Warn("agent was never started; exiting")
			os.Exit(0)
		}
	})
	return a.serve(ln)
}

// listen opens the agent's socket, in the sandbox's network namespace (an abstract name: no file in the root).
func listen() (net.Listener, error) {
	ln, err := net.Listen("unix", "@"+SocketName)
	if err != nil {
		return nil, fmt.Errorf("agent: listen: %w", err)
	}
	return ln, nil
}

// prepare does the agent's set-up that needs nothing of its sandbox: the staged mounts of its root (stageRoot),
// its namespaces registered with the family init, and the seccomp-filtered thread that starts its commands.
func (a *Agent) prepare() error {
	if err := stageRoot(); err != nil {
		return fmt.Errorf("agent: set up root: %w", err)
	}
	if a.toInit != nil {
		// The family init judges setns(2) calls by the namespaces a sandbox's processes are in, but cannot read
		// this (non-dumpable) agent's /proc/<pid>/ns: tell it.
		if err := a.registerNamespaces(); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
	}
	warmJSON()
	var err error
	if a.bpf, err = seccomp.ProgramBytes(); err != nil {
		return fmt.Errorf("agent: seccomp program: %w", err)
	}
	a.repl = &repl{agent: a, turn: make(chan struct{}, 1)}
	if err := a.runSpawner(); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// warmJSON builds encoding/json's per-type caches (field lists, encoders, decoders) for the messages of a
// sandbox's first calls, by one round trip of each: built by reflection on first use, ~0.4 ms of CPU per agent
// that would otherwise fall on the fork or create that claims it (a spare runs this ahead of its claim).
func warmJSON() {
	value := ""
	for _, m := range []any{
		&Config{},
		&Request{Env: map[string]string{"": ""}, Argv: []string{""}, Targets: []ForkTarget{{}}, Modules: []string{""}},
		&Event{Value: &value, Error: &ExecError{}, Results: []Result{{Data: map[string]json.RawMessage{"": json.RawMessage("0")}}},
			Pids: []int{0}, Interrupted: &Interrupted{}, Skipped: []Skipped{{}}},
	} {
		if b, err := json.Marshal(m); err == nil {
			json.Unmarshal(b, m) //nolint:errcheck // only the caches matter
		}
	}
}

// SpareArg is the argument that starts a spare agent.
const SpareArg = "--spare"

// ConfigFromInit is the argument that starts an agent whose config is the first message on its init channel.
const ConfigFromInit = "--config-from-init"

// NamespacesMsg prefixes the message with which an agent registers its namespaces with the family init: the
// prefix, then a JSON list of links as /proc/self/ns shows them ("net:[4026532000]").
const NamespacesMsg = "ns "

func readInitConfig() (string, error) {
	buf, _, err := recvPacket(fdInit, nil, 0)
	if err != nil {
		return "", fmt.Errorf("agent: read config: %w", err)
	}
	if len(buf) == 0 {
		return "", errors.New("agent: the family init closed before sending a config")
	}
	return string(buf), nil
}

// recvPacket receives the next message of a SOCK_SEQPACKET socket into a buffer of its size (the message is
// peeked at first for its length): a fixed buffer large enough for any message was 64 KiB, zeroed on the
// goroutine's stack, which then stayed 128 KiB long, all of it private memory of every agent.
func recvPacket(fd int, oob []byte, flags int) (msg []byte, oobn int, err error) {
	for {
		n, _, _, _, err := unix.Recvmsg(fd, nil, nil, unix.MSG_PEEK|unix.MSG_TRUNC)
		if err == nil {
			msg = make([]byte, n)
			n, oobn, _, _, err = unix.Recvmsg(fd, msg, oob, flags)
			if err == nil {
				return msg[:n], oobn, nil
			}
		}
		if !errors.Is(err, unix.EINTR) {
			return nil, 0, err
		}
	}
}

func (a *Agent) registerNamespaces() error {
	// A non-dumpable process cannot list its own /proc/self/ns (the directory belongs to host root), but can
	// read each link.
	var links []string
	for _, ns := range []string{"ipc", "uts", "net", "mnt", "cgroup", "pid", "time", "user"} {
		if l, err := os.Readlink("/proc/self/ns/" + ns); err == nil {
			links = append(links, l)
		}
	}
	if len(links) < 4 {
		return errors.New("register namespaces: cannot read /proc/self/ns")
	}
	b, _ := json.Marshal(links)
	if _, _, err := a.toInit.WriteMsgUnix(append([]byte(NamespacesMsg), b...), nil, nil); err != nil {
		return fmt.Errorf("register namespaces: %w", err)
	}
	// Wait for the init to have recorded them: a forked interpreter may ask to join them right after this agent
	// answers its first ping.
	a.toInit.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer a.toInit.SetReadDeadline(time.Time{})
	ack := make([]byte, 16)
	if _, err := a.toInit.Read(ack); err != nil {
		return fmt.Errorf("register namespaces: no answer from the family init: %w", err)
	}
	return nil
}

var errNotClaimed = errors.New("agent: spare closed without work")

// awaitClaim waits for a spare's work: one message on descriptor fdRootMount holding the config, with the
// root mount's descriptor attached, which then takes descriptor fdRootMount's place.
func awaitClaim() (string, error) {
	oob := make([]byte, unix.CmsgSpace(4))
	buf, oobn, err := recvPacket(fdRootMount, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return "", fmt.Errorf("agent: wait for work: %w", err)
	}
	if len(buf) == 0 && oobn == 0 {
		return "", errNotClaimed
	}
	fds := Rights(oob[:oobn])
	if len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return "", fmt.Errorf("agent: claimed with %d descriptors, want the root mount", len(fds))
	}
	// The root mount replaces the claim socket: the rest of the agent finds it where a spawned agent has it.
	if err := unix.Dup3(fds[0], fdRootMount, 0); err != nil {
		return "", fmt.Errorf("agent: take the root mount: %w", err)
	}
	unix.Close(fds[0])
	return string(buf), nil
}

// Agent serves requests inside one sandbox.
type Agent struct {
	log *slog.Logger

	mu      sync.Mutex
	env     map[string]string
	cwd     string
	cpus    int
	started bool

	gcPercent int       // the collector's setting once the sandbox is started (off until then)
	gcOnce    sync.Once // turns it back on
	idle      idleRelease

	repl  *repl
	calls CallSet // the run_code and exec calls being served, for interrupt

	token    string      // expected token of an attaching forked interpreter ("" when none is expected)
	forked   atomic.Bool // the sandbox's interpreter is forked from a parent sandbox's, which attaches (closing attached)
	attached chan struct{}

	// Every process of the sandbox runs under a seccomp filter that sends process-targeting syscalls (kill,
	// ptrace, setns, ...) to this supervisor, which allows them only within the caller's own sandbox.
	sup *seccomp.Supervisor
	bpf []byte

	toInit *net.UnixConn // channel to the family init, which supervises every listener of the family

	spawn chan func() // runs functions on the filtered spawner thread (see runSpawner)
}

// supervise hands a seccomp listener received from a sandbox process to the family init, which serves it for
// as long as any process uses the filter: the filter of an interpreter is inherited by every fork of it, in
// other sandboxes of the family, which must not depend on this agent staying alive. Without an init channel
// the agent serves the listener itself.
func (a *Agent) supervise(fd int) {
	if a.toInit != nil {
		_, _, err := a.toInit.WriteMsgUnix([]byte("listener"), unix.UnixRights(fd), nil)
		if err == nil {
			unix.Close(fd)
			return
		}
		a.log.Warn("hand a seccomp listener to the family init; serving it here", "err", err)
	}
	go func() {
		if err := a.sup.Serve(context.Background(), fd); err != nil {
			a.log.Warn("seccomp supervisor", "err", err)
		}
	}()
}

// maxPassedFDs is the most descriptors one message may carry (the kernel's SCM_MAX_FD): a fork of 32 children
// passes 5 descriptors per child (4 namespaces and a pipe).
const maxPassedFDs = 253

// recvFDs reads one message from c with the descriptors passed along with it.
func recvFDs(c *net.UnixConn) ([]byte, []int, error) {
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(maxPassedFDs*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, err
	}
	return buf[:n], Rights(oob[:oobn]), nil
}

// recvFD reads one message carrying at most one file descriptor from c (-1 when none came).
func recvFD(c *net.UnixConn) ([]byte, int, error) {
	msg, fds, err := recvFDs(c)
	if err != nil {
		return nil, -1, err
	}
	fd := -1
	for i, f := range fds {
		if i == 0 {
			fd = f
		} else {
			unix.Close(f)
		}
	}
	return msg, fd, nil
}

// Rights returns the descriptors passed (SCM_RIGHTS) in a message's control data.
func Rights(oob []byte) []int {
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob); err == nil {
		for _, m := range msgs {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	return fds
}

// peerPid is the pid of the process at the other end of c, as this process's PID namespace sees it (0: outside
// it), or -1 if it cannot be read.
func peerPid(c net.Conn) int {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return -1
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return -1
	}
	pid := -1
	raw.Control(func(fd uintptr) { //nolint:errcheck // pid stays -1
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}

func (a *Agent) serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go a.handleConn(c)
	}
}

func (a *Agent) handleConn(c net.Conn) {
	keep := false
	defer func() {
		if !keep {
			c.Close()
		}
	}()
	// Only the server may drive the agent. It dials from outside the family's PID namespace, so the peer's pid
	// reads 0 here; every process of a sandbox (whatever uid it takes) has a pid in the family's namespace. The
	// one call a sandbox process may make is attach_repl, with its one-time token: a forked interpreter.
	fromServer := peerPid(c) == 0
	// The first message of a connection may carry descriptors for its request (Client.CallWithFiles).
	first, fds, err := recvFDs(c.(*net.UnixConn))
	if err != nil {
		return
	}
	var files []*os.File
	for _, fd := range fds {
		f := os.NewFile(uintptr(fd), "request-file")
		files = append(files, f)
		defer f.Close()
	}
	r := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(first), c), 64<<10)
	w := &eventWriter{w: bufio.NewWriterSize(c, 32<<10)}
	for {
		line, err := readLine(r, maxRequest)
		if err != nil {
			return
		}
		var req Request
		if err := json.Unmarshal(line, &req); err != nil {
			w.emit(Event{Type: "error", Message: "bad request: " + err.Error()})
			return
		}
		req.files, files = files, nil
		if len(req.files) > 0 {
			req.file = req.files[0]
		}
		if req.Op != OpAttach && !fromServer {
			w.emit(Event{Type: "error", Message: "refused: only the ramify server may call the agent"})
			return
		}
		if req.Op == OpAttach {
			// The connection now belongs to the interpreter: hand it over and stop reading it here.
			keep = a.attachRepl(c, r, req)
			return
		}
		if req.Op == OpSession {
			a.idle.begin()
			a.session(c.(*net.UnixConn), r, req)
			a.idle.end()
			return
		}
		ctx, done := untilHangup(c)
		a.idle.begin()
		a.handle(ctx, req, w)
		a.idle.end()
		hungUp := done()
		for _, f := range req.files {
			f.Close()
		}
		if w.err != nil || hungUp {
			return
		}
	}
}

// untilHangup returns a context that ends if the server hangs up on c while a request runs: the server closes the
// connection when its caller's context ends (a client that went away, a cancelled request), and the request's
// work (run_code, exec) then stops instead of holding the sandbox for the next call. It only peeks (MSG_PEEK):
// the server may send its next request on the connection the moment this one's answer is out, and those bytes
// belong to the next readLine. done stops watching and reports whether the server hung up.
func untilHangup(c net.Conn) (context.Context, func() (hungUp bool)) {
	ctx, cancel := context.WithCancel(context.Background())
	uc, ok := c.(*net.UnixConn)
	raw, err := func() (syscall.RawConn, error) {
		if !ok {
			return nil, errors.New("not a unix connection")
		}
		return uc.SyscallConn()
	}()
	if err != nil {
		return ctx, func() bool { cancel(); return false }
	}
	watched := make(chan struct{})
	var gone atomic.Bool
	go func() {
		defer close(watched)
		hung := false
		err := raw.Read(func(fd uintptr) bool {
			var b [1]byte
			n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				return false // nothing yet: wait until the socket is readable
			}
			hung = n == 0 || err != nil // end of stream or an error; bytes (a next request) are no hang-up
			return true
		})
		if err == nil && hung {
			gone.Store(true)
			cancel()
		}
	}()
	return ctx, func() bool {
		c.SetReadDeadline(time.Unix(1, 0)) // ends a wait in raw.Read
		<-watched
		c.SetReadDeadline(time.Time{})
		cancel()
		return gone.Load()
	}
}

const maxRequest = 64 << 20

func readLine(r *bufio.Reader, limit int) ([]byte, error) {
	var buf []byte
	for {
		part, isPrefix, err := r.ReadLine()
		if err != nil {
			return nil, err
		}
		buf = append(buf, part...)
		if len(buf) > limit {
			return nil, fmt.Errorf("line longer than %d bytes", limit)
		}
		if !isPrefix {
			return buf, nil
		}
	}
}

// eventWriter writes events as JSON lines, flushing after each so output streams.
type eventWriter struct {
	mu  sync.Mutex
	w   *bufio.Writer
	err error
}

func (e *eventWriter) emit(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return
	}
	b, _ := json.Marshal(ev)
	b = append(b, '\n')
	if _, err := e.w.Write(b); err != nil {
		e.err = err
		return
	}
	e.err = e.w.Flush()
}

func (a *Agent) handle(ctx context.Context, req Request, w *eventWriter) {
	switch req.Op {
	case OpPing:
		w.emit(Event{Type: "ok", Pid: os.Getpid(), ReplPid: a.repl.currentPid()})
	case OpStart:
		a.mu.Lock()
		a.env, a.cwd, a.cpus, a.started = req.Env, req.Cwd, req.CPUs, true
		a.mu.Unlock()
		running := a.repl.currentPid() != 0
		pid, err := a.repl.ensure()
		if err != nil {
			w.emit(Event{Type: "error", Message: "start interpreter: " + err.Error()})
			return
		}
		forked := a.forked.Load()
		if (running && !forked) || (forked && req.Fresh) {
			// A warm sandbox being claimed: its interpreter already runs; give it the sandbox's env and cwd. So
			// too a family's zygote, which moved itself in. An interpreter forked from a parent sandbox
			// is not told: it keeps its parent's environment and took the child's cwd when it moved in (whether
			// it attached before this call or after, the same). An env that Python reads only as it starts
			// (PYTHONPATH, a locale, HOME for the user site) needs an interpreter started with it instead, and
			// so does a zygote's that imported packages ahead (Client.Preload) which an import in this sandbox
			// would not find the same (its env, cwd or files differ: the interpreter tells).
			fresh := startupEnvDiffers(req.Env)
			if !fresh {
				holds, err := a.repl.configure(withDefaults(ThreadEnv(req.CPUs), req.Env), req.Cwd)
				if err != nil {
					w.emit(Event{Type: "error", Message: "configure interpreter: " + err.Error()})
					return
				}
				fresh = !holds
			}
			if fresh {
				a.repl.drop()
				pid, err = a.repl.spawn()
				if err != nil {
					w.emit(Event{Type: "error", Message: "start interpreter: " + err.Error()})
					return
				}
			}
			if req.Fresh {
				// From now on its interpreter is this sandbox's own, as a fresh one: a later start (the claim of
				// a warm sandbox made from a zygote) gives it env and cwd too.
				a.forked.Store(false)
			}
		}
		w.emit(Event{Type: "ok", Pid: os.Getpid(), ReplPid: pid})
		// Set-up is over: the collector runs again as usual, a moment later, off the path of the sandbox's first
		// calls. It is not forced now: set-up leaves little garbage (~0.17 MB allocated, most of it buffers only
		// partly written; the seccomp filter is compiled ahead), and a first collection costs more than it frees,
		// in the runtime's own mark structures: a fork child's agent is 1.05 MiB private right after its first
		// call, 1.21 MiB once a collection and FreeOSMemory have run.
		time.AfterFunc(300*time.Millisecond, func() {
			a.gcOnce.Do(func() {
				debug.SetGCPercent(a.gcPercent)
				debug.SetMemoryLimit(math.MaxInt64)
				a.idle.ready()
			})
		})
	case OpRunCode:
		ctx, end := a.calls.Begin(ctx, OpRunCode)
		defer end()
		w.emit(a.repl.run(ctx, req.Code, req.Env, req.TimeoutS, w.emit))
	case OpExec:
		ctx, end := a.calls.Begin(ctx, OpExec)
		defer end()
		w.emit(a.exec(ctx, req, w.emit))
	case OpReplaceStuck:
		w.emit(Event{Type: "ok", Replaced: a.repl.replaceStuck(time.Duration(req.GraceMs) * time.Millisecond)})
	case OpInterrupt:
		if req.What != InterruptAll && req.What != InterruptRunCode && req.What != InterruptExec {
			w.emit(Event{Type: "error", Message: fmt.Sprintf("interrupt: unknown target %q", req.What)})
			return
		}
		n := a.calls.Interrupt(req.What)
		w.emit(Event{Type: "ok", Interrupted: &n})
	case OpSnapshot:
		if !req.Stream || req.file == nil {
			w.emit(Event{Type: "error", Message: "snapshot_repl needs a stream"})
			return
		}
		m, err := a.repl.tracked(func() (replMsg, error) {
			return a.repl.session("snapshot", req, func(pid int) { w.emit(Event{Type: "save_copy", Pid: pid}) })
		})
		if err != nil {
			w.emit(replError("save interpreter", err))
			return
		}
		w.emit(Event{Type: "ok", Skipped: append(m.Skipped, a.otherProcesses()...), Preload: m.Preload})
	case OpRestore:
		if req.Stream && req.file == nil {
			w.emit(Event{Type: "error", Message: "restore_repl: the stream did not arrive"})
			return
		}
		m, err := a.repl.session("restore", req, nil)
		if err != nil {
			w.emit(replError("restore interpreter", err))
			return
		}
		w.emit(Event{Type: "ok", Skipped: m.Skipped, Read: m.Read})
	case OpWarm:
		if err := a.repl.warm(ctx); err != nil {
			w.emit(Event{Type: "error", Message: "warm interpreter: " + err.Error()})
			return
		}
		w.emit(Event{Type: "ok"})
	case OpForkCheck:
		hooks, err := a.repl.forkHooks()
		if err != nil {
			w.emit(Event{Type: "error", Message: "check the interpreter's fork handlers: " + err.Error()})
			return
		}
		w.emit(Event{Type: "ok", ForkHooks: hooks})
	case OpPreload:
		if err := a.repl.preload(req.Modules); err != nil {
			w.emit(replError("preload", err))
			return
		}
		w.emit(Event{Type: "ok"})
	case OpFork:
		pids, err := a.repl.fork(req.Targets, req.files, req.Handover)
		if err != nil {
			w.emit(replError("fork interpreter", err))
			return
		}
		w.emit(Event{Type: "ok", Pids: pids})
	default:
		w.emit(Event{Type: "error", Message: fmt.Sprintf("unknown op %q", req.Op)})
	}
}

// replError is the answer to an interpreter call that failed with err: Lost when the interpreter was found dead.
func replError(what string, err error) Event {
	return Event{Type: "error", Message: what + ": " + err.Error(), Lost: isLost(err), TasksFull: isTasksFull(err)}
}

// environ builds a process environment from the sandbox's env and per-call overrides.
// baseEnv is every sandbox's environment before its own (and ThreadEnv).
var baseEnv = map[string]string{
	"PATH":             "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME":             "/root",
	"LANG":             "C.UTF-8",
	"TERM":             "xterm",
	"PYTHONUNBUFFERED": "1",
}

// startupEnvDiffers reports whether env sets, to another value than an interpreter started before it was known
// had, a variable that Python or the dynamic loader reads only at start: PYTHON* (PYTHONPATH, PYTHONHASHSEED,
// ...), LD_*, the locale (LANG, LC_*), HOME (the user site directory). The heap settings are left out: they
// apply whatever the env says (interpreterHeap).
func startupEnvDiffers(env map[string]string) bool {
	for k, v := range env {
		if k == "PYTHONMALLOC" || k == "GLIBC_TUNABLES" {
			continue
		}
		startup := strings.HasPrefix(k, "PYTHON") || strings.HasPrefix(k, "LD_") || strings.HasPrefix(k, "LC_") ||
			k == "LANG" || k == "LANGUAGE" || k == "HOME"
		if startup && baseEnv[k] != v {
			return true
		}
	}
	return false
}

func (a *Agent) environ(extra map[string]string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := make(map[string]string, len(baseEnv)+len(threadVars)+len(a.env)+len(extra))
	for k, v := range baseEnv {
		m[k] = v
	}
	for k, v := range ThreadEnv(a.cpus) {
		m[k] = v
	}
	for k, v := range a.env {
		m[k] = v
	}
	for k, v := range extra {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

// threadVars are the variables that size the thread pools of OpenMP and the BLAS libraries numpy, scipy and
// PyTorch load. Left unset, each sizes its pool to the host's CPUs, not the sandbox's quota: on a 1-vCPU sandbox
// of a 2-core host, OpenBLAS's second thread makes `import numpy` take 130-190 ms instead of ~95 (its threads'
// start-up is charged to the quota) and its matrix products contend for one CPU.
var threadVars = []string{"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}

// ThreadEnv is the environment a sandbox of cpus whole vCPUs gets by default (its own env overrides it): every
// thread-pool variable set to cpus. cpus <= 0 sets nothing.
func ThreadEnv(cpus int) map[string]string {
	if cpus <= 0 {
		return nil
	}
	m := make(map[string]string, len(threadVars))
	for _, k := range threadVars {
		m[k] = strconv.Itoa(cpus)
	}
	return m
}

// withDefaults returns env with every variable of defaults it does not set.
func withDefaults(defaults, env map[string]string) map[string]string {
	if len(defaults) == 0 {
		return env
	}
	out := make(map[string]string, len(defaults)+len(env))
	for k, v := range defaults {
		out[k] = v
	}
	for k, v := range env {
		out[k] = v
	}
	return out
}

func (a *Agent) workdir(override string) string {
	if override != "" {
		return override
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cwd != "" {
		return a.cwd
	}
	return "/root"
}

// capped accumulates output up to a limit and notes truncation. The limit counts bytes of the output's JSON
// encoding, not of the output: a control character is 1 byte of output but 6 on the wire (\u0001), and the
// events that carry the output must stay within maxEvent whatever bytes a program writes.
type capped struct {
	sb        strings.Builder
	limit     int
	size      int // encoded size of sb
	truncated bool
}

// outputLimit is the cap of each of a call's collected stdout and stderr, in bytes of JSON (see capped).
const outputLimit = 32 << 20

// fieldLimit caps each of a run_code result's value, error value and traceback, in bytes of JSON.
const fieldLimit = 4 << 20

// resultsLimit caps the JSON size of all of one run_code call's rich results together (repl.py keeps to it;
// the agent replaces what goes beyond with a note).
const resultsLimit = 16 << 20

// maxEvent bounds one event line from the agent: a terminal event carries two capped streams, three capped
// fields and the capped results, and their truncation notes.
const maxEvent = 2*outputLimit + 3*fieldLimit + resultsLimit + 1<<20

const truncatedNote = "\n[output truncated]\n"

func (c *capped) add(s string) {
	if c.truncated {
		return
	}
	n, cost := encodedPrefix(s, c.limit-c.size)
	c.sb.WriteString(s[:n])
	c.size += cost
	if n < len(s) {
		c.sb.WriteString(truncatedNote)
		c.truncated = true
	}
}

// capField shortens s, if its JSON encoding exceeds limit bytes, to a prefix that fits, marked as truncated.
func capField(s string, limit int) string {
	n, _ := encodedPrefix(s, limit)
	if n == len(s) {
		return s
	}
	return s[:n] + truncatedNote
}

// encodedPrefix returns the length of the longest prefix of s whose JSON encoding (as encoding/json writes it:
// HTML characters escaped, invalid UTF-8 replaced) takes at most room bytes, and that encoding's size (without
// the quotes). It never splits a UTF-8 sequence.
func encodedPrefix(s string, room int) (n, size int) {
	for n < len(s) {
		c, w := jsonCost(s[n:])
		if size+c > room {
			break
		}
		size += c
		n += w
	}
	return n, size
}

// jsonCost returns how many bytes encoding/json writes for the first character of s, and that character's length
// in s.
func jsonCost(s string) (cost, width int) {
	b := s[0]
	if b < utf8.RuneSelf {
		switch {
		case b == '"' || b == '\\' || b == '\n' || b == '\r' || b == '\t':
			return 2, 1
		case b < 0x20 || b == '<' || b == '>' || b == '&':
			return 6, 1 // \u00XX (\b and \f take 2; counted as 6, an upper bound)
		}
		return 1, 1
	}
	r, w := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError && w == 1 || r == '\u2028' || r == '\u2029' {
		return 6, w // \ufffd for an invalid byte, \u2028, \u2029
	}
	return w, w
}

var _ io.Writer = (*bufio.Writer)(nil)

// otherProcesses lists this sandbox's processes other than the agent and the interpreter (same cgroup as the
// agent): a pause cannot save them.
func (a *Agent) otherProcesses() []Skipped {
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	repl := a.repl.currentPid()
	var out []Skipped
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || pid == repl {
			continue
		}
		cg, err := os.ReadFile("/proc/" + e.Name() + "/cgroup")
		if err != nil || !bytes.Equal(cg, own) {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		name := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
		if name == "" {
			continue // a kernel thread or a zombie
		}
		out = append(out, Skipped{Name: name, Type: "process", Reason: fmt.Sprintf("pid %d: only the Python interpreter is saved; other processes are not", pid)})
	}
	return out
}
