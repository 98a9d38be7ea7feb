// Package fake is an in-memory runtime (runtime.Runtime and runtime.Forker) and snapshot store
// (snapstore.Store) for tests of the sandbox service that need no root, no namespaces and no image: a sandbox is
// a map of variables (its "interpreter") and a temporary directory (its writable layer, which is also its root).
//
// The agent is real on the wire: Agent returns an agent.Client talking JSON lines over a unix socketpair to an
// in-process fake agent, so the service's calls, streaming and SCM_RIGHTS hand-overs (pause, resume) take the
// same path as with a real sandbox. The fake interpreter understands one statement per call:
//
//	NAME = VALUE    assigns the string VALUE
//	NAME            evaluates to the value of NAME (a NameError when unset)
//	print TEXT      writes TEXT and a newline to stdout (streamed)
//	wait GATE       blocks until the test opens GATE (Runtime.Gate) or the call is cancelled
//	raise TEXT      fails with an exception
//
// exec answers with the command echoed on stdout and exit code 0; "exit N" exits with N; "wait GATE" blocks.
//
// Faults: a function installed with Runtime.SetFault is called at the start of every runtime method and agent operation with the
// method's name ("Create", "Destroy", "Fork", "Swap", "Recover", "Configure", "Freeze", "Thaw", "Stop", or
// "agent:<op>") and the sandbox id; an error it returns is the method's error, and it may block (to hold an
// operation half-way). Snapshots.SetFault does the same for the store's methods ("Put", "Get", "Copy", "Delete").
package fake

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/runtime"
)

// Runtime is the in-memory runtime.
type Runtime struct {
	dir string

	mu        sync.Mutex
	faultFn   func(ctx context.Context, method, id string) error
	sandboxes map[string]*Sandbox // by id
	gates     map[string]chan struct{}
	nextPid   int
	layers    int
	prepared  map[string]int   // PrepareResume calls, by their packages joined with ","
	keptSaves map[string]int64 // LeaveSaveKept: what the next Reclaim reports kept, by sandbox id
}

// Sandbox is one fake sandbox.
type Sandbox struct {
	ID, Family, Layer string
	Pid               int
	Spec              runtime.Spec
	frozen, dead      bool // guarded by Runtime.mu

	mu     sync.Mutex
	vars   map[string]string
	count  int
	stirs  int // changes made without a call (Stir)
	client *agent.Client
	calls  agent.CallSet // run_code and exec calls being served, for interrupt
}

var (
	_ runtime.Runtime        = (*Runtime)(nil)
	_ runtime.Forker         = (*Runtime)(nil)
	_ runtime.Stiller        = (*Runtime)(nil)
	_ runtime.ResumePreparer = (*Runtime)(nil)
)

// Intact implements runtime.Stiller: a sandbox the fake runs is intact.
func (r *Runtime) Intact(h runtime.Handle) error {
	if r.Get(h.ID) == nil {
		return errors.New("fake: no such sandbox")
	}
	return nil
}

// Stillness implements runtime.Stiller: the mark moves with every call the sandbox's interpreter runs and with
// every Stir.
func (r *Runtime) Stillness(ctx context.Context, h runtime.Handle) (runtime.Stillness, error) {
	if err := r.fault(ctx, "Stillness", h.ID); err != nil {
		return runtime.Stillness{}, err
	}
	sb := r.Get(h.ID)
	if sb == nil {
		return runtime.Stillness{}, errors.New("fake: no such sandbox")
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return runtime.Stillness{Mark: fmt.Sprintf("%d/%d", sb.count, sb.stirs)}, nil
}

// Stir changes sandbox id as a process of its own would, without a call through the runtime.
func (r *Runtime) Stir(id string, name, value string) {
	if sb := r.Get(id); sb != nil {
		sb.mu.Lock()
		sb.vars[name] = value
		sb.stirs++
		sb.mu.Unlock()
	}
}

// PrepareResume counts the call (Prepared reads the counts).
func (r *Runtime) PrepareResume(preload []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.prepared == nil {
		r.prepared = map[string]int{}
	}
	r.prepared[strings.Join(preload, ",")]++
}

// Prepared returns how many times PrepareResume was called with preload, and resets that count.
func (r *Runtime) Prepared(preload ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := strings.Join(preload, ",")
	n := r.prepared[k]
	delete(r.prepared, k)
	return n
}

// New returns a runtime keeping its layers under dir (a test's temporary directory).
func New(dir string) *Runtime {
	os.MkdirAll(filepath.Join(dir, "lower"), 0o755) //nolint:errcheck // the first layer creation reports it
	return &Runtime{dir: dir, sandboxes: map[string]*Sandbox{}, gates: map[string]chan struct{}{}, nextPid: 1000}
}

// SetFault installs f (nil: none), called at the start of every method (see the package comment).
func (r *Runtime) SetFault(f func(ctx context.Context, method, id string) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faultFn = f
}

func (r *Runtime) fault(ctx context.Context, method, id string) error {
	r.mu.Lock()
	f := r.faultFn
	r.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(ctx, method, id)
}

// Gate returns a function that opens gate name (the "wait name" statement returns). Opening twice is harmless.
func (r *Runtime) Gate(name string) (open func()) {
	g := r.gate(name)
	var once sync.Once
	return func() { once.Do(func() { close(g) }) }
}

func (r *Runtime) gate(name string) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.gates[name]
	if g == nil {
		g = make(chan struct{})
		r.gates[name] = g
	}
	return g
}

// Get returns the live sandbox known under id (nil if none).
func (r *Runtime) Get(id string) *Sandbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sandboxes[id]
}

// IDs lists the ids of the sandboxes the runtime holds (dead ones too), for leak checks.
func (r *Runtime) IDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id := range r.sandboxes {
		out = append(out, id)
	}
	return out
}

// Kill marks a sandbox's processes dead (as a host reboot would): Recover fails for it from now on.
func (r *Runtime) Kill(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb := r.sandboxes[id]; sb != nil {
		sb.dead = true
	}
}

// LeaveSaveKept has the next Reclaim find sandbox id's save copy's cgroup left over and still holding kept
// bytes (a server killed during a save whose copy wrote into memory the sandbox keeps).
func (r *Runtime) LeaveSaveKept(id string, kept int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keptSaves == nil {
		r.keptSaves = map[string]int64{}
	}
	r.keptSaves[id] = kept
}

// Frozen reports whether the sandbox named id is frozen.
func (r *Runtime) Frozen(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[id]
	return sb != nil && sb.frozen
}

// Var reads a variable of a sandbox's interpreter.
func (sb *Sandbox) Var(name string) (string, bool) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	v, ok := sb.vars[name]
	return v, ok
}

func (r *Runtime) layerDir(layer string) string { return filepath.Join(r.dir, "layers", layer) }

func (r *Runtime) newSandbox(id, family string, spec runtime.Spec, vars map[string]string) (*Sandbox, error) {
	r.mu.Lock()
	r.nextPid++
	r.layers++
	sb := &Sandbox{ID: id, Family: family, Layer: fmt.Sprintf("%s-%d", id, r.layers), Pid: r.nextPid, Spec: spec, vars: vars}
	r.mu.Unlock()
	if err := os.MkdirAll(r.layerDir(sb.Layer), 0o755); err != nil {
		return nil, err
	}
	sb.client = agent.NewClient(func(ctx context.Context) (net.Conn, error) { return r.dial(sb) })
	return sb, nil
}

func (r *Runtime) handle(sb *Sandbox) runtime.Handle { return sb.Handle() }

// id is the id the sandbox answers to now (a merge changes it).
func (sb *Sandbox) id() string {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.ID
}

// Create starts a sandbox; spec.Populate, if set, fills its layer first.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	if err := r.fault(ctx, "Create", spec.ID); err != nil {
		return runtime.Handle{}, err
	}
	r.mu.Lock()
	old := r.sandboxes[spec.ID]
	exists := old != nil && !old.dead
	r.mu.Unlock()
	if exists {
		return runtime.Handle{}, fmt.Errorf("fake: sandbox %s exists", spec.ID)
	}
	sb, err := r.newSandbox(spec.ID, "fam_"+strings.TrimPrefix(spec.ID, "sbx_"), spec, map[string]string{})
	if err != nil {
		return runtime.Handle{}, err
	}
	if spec.Populate != nil {
		if err := spec.Populate(r.layerDir(sb.Layer)); err != nil {
			os.RemoveAll(r.layerDir(sb.Layer))
			return runtime.Handle{}, err
		}
	}
	r.mu.Lock()
	r.sandboxes[spec.ID] = sb
	r.mu.Unlock()
	return r.handle(sb), nil
}

// Destroy forgets the sandbox and removes its layer (the handle's, when the runtime no longer knows the
// sandbox). Destroying what does not exist is not an error.
func (r *Runtime) Destroy(ctx context.Context, h runtime.Handle) error {
	if err := r.fault(ctx, "Destroy", h.ID); err != nil {
		return err
	}
	r.mu.Lock()
	sb := r.sandboxes[h.ID]
	if sb != nil && (h.AgentPid == 0 || h.AgentPid == sb.Pid) {
		delete(r.sandboxes, h.ID)
	} else {
		sb = nil
	}
	r.mu.Unlock()
	if sb != nil {
		sb.client.Close()
		return os.RemoveAll(r.layerDir(sb.Layer))
	}
	// Works from the handle alone, as the real runtime's does: the layer of a sandbox it no longer knows.
	return os.RemoveAll(r.layerDir(h.Layer()))
}

// Stop kills a sandbox's processes and keeps its layer (the service's optional Stop).
func (r *Runtime) Stop(ctx context.Context, h runtime.Handle) error {
	if err := r.fault(ctx, "Stop", h.ID); err != nil {
		return err
	}
	r.Kill(h.ID)
	return nil
}

// Recover succeeds when the sandbox is alive and is the one the handle names, and thaws it.
func (r *Runtime) Recover(ctx context.Context, h runtime.Handle) error {
	if err := r.fault(ctx, "Recover", h.ID); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[h.ID]
	if w := r.byPid(h.AgentPid); w != nil && w != sb && w.id() != h.ID && !w.dead {
		// A re-keyed handle (a merge recorded before its swap ran): the winner now answers to h.ID.
		delete(r.sandboxes, w.id())
		w.mu.Lock()
		w.ID = h.ID
		w.mu.Unlock()
		r.sandboxes[h.ID] = w
		sb = w
	}
	switch {
	case sb == nil:
		return errors.New("fake: no such sandbox")
	case sb.dead:
		return errors.New("fake: its processes are gone")
	case sb.Pid != h.AgentPid:
		return errors.New("fake: a different sandbox has its id")
	}
	sb.frozen = false // as the real runtime does: a fork or pause cut short left it frozen
	return nil
}

// byPid finds the sandbox whose agent has pid. The caller holds r.mu.
func (r *Runtime) byPid(pid int) *Sandbox {
	for _, sb := range r.sandboxes {
		if sb.Pid == pid {
			return sb
		}
	}
	return nil
}

// Agent returns the client of the sandbox's fake agent.
func (r *Runtime) Agent(id string) (*agent.Client, error) {
	sb := r.Get(id)
	if sb == nil {
		return nil, fmt.Errorf("%w: fake: no sandbox %s", agent.ErrAgentGone, id)
	}
	return sb.client, nil
}

// RootPath is the sandbox's layer directory (the fake has no overlay: the layer is the whole root).
func (r *Runtime) RootPath(h runtime.Handle) string { return r.layerDir(h.Layer()) }

// Configure records the new spec.
func (r *Runtime) Configure(ctx context.Context, h runtime.Handle, spec runtime.Spec) error {
	if err := r.fault(ctx, "Configure", h.ID); err != nil {
		return err
	}
	sb := r.Get(h.ID)
	if sb == nil {
		return errors.New("fake: no such sandbox")
	}
	sb.mu.Lock()
	sb.Spec.VCPU, sb.Spec.MemMiB, sb.Spec.MaxProcs, sb.Spec.Env, sb.Spec.Cwd = spec.VCPU, spec.MemMiB, spec.MaxProcs, spec.Env, spec.Cwd
	sb.mu.Unlock()
	return nil
}

// Usage reports nothing in use.
func (r *Runtime) Usage(h runtime.Handle) (runtime.Usage, error) {
	return runtime.Usage{DiskBytes: -1, DiskLimitBytes: -1}, nil
}

// Close does nothing: sandboxes outlive the runtime, as real ones do.
func (r *Runtime) Close() error { return nil }

// Fork copies the parent's variables and layer into each child, in the parent's family.
func (r *Runtime) Fork(ctx context.Context, parent runtime.Handle, children []runtime.Spec) (runtime.ForkResult, error) {
	start := time.Now()
	if err := r.fault(ctx, "Fork", parent.ID); err != nil {
		return runtime.ForkResult{}, err
	}
	r.mu.Lock()
	p := r.sandboxes[parent.ID]
	alive := p != nil && !p.dead
	r.mu.Unlock()
	if !alive {
		return runtime.ForkResult{}, errors.New("fake: no such parent")
	}
	p.mu.Lock()
	vars := make(map[string]string, len(p.vars))
	for k, v := range p.vars {
		vars[k] = v
	}
	p.mu.Unlock()
	var made []*Sandbox
	undo := func() {
		for _, sb := range made {
			os.RemoveAll(r.layerDir(sb.Layer))
		}
	}
	for _, spec := range children {
		kv := make(map[string]string, len(vars))
		for k, v := range vars {
			kv[k] = v
		}
		sb, err := r.newSandbox(spec.ID, p.Family, spec, kv)
		if err == nil {
			made = append(made, sb)
			err = copyDir(r.layerDir(p.Layer), r.layerDir(sb.Layer))
		}
		if err != nil {
			undo()
			return runtime.ForkResult{}, err
		}
	}
	res := runtime.ForkResult{}
	r.mu.Lock()
	for _, sb := range made {
		r.sandboxes[sb.ID] = sb
		res.Children = append(res.Children, r.handle(sb))
	}
	r.mu.Unlock()
	res.Total = time.Since(start)
	return res, nil
}

// Swap makes parent's id drive winner's sandbox; the parent's old sandbox is destroyed.
func (r *Runtime) Swap(ctx context.Context, parent, winner runtime.Handle) (runtime.Handle, error) {
	if err := r.fault(ctx, "Swap", parent.ID); err != nil {
		return runtime.Handle{}, err
	}
	r.mu.Lock()
	p, w := r.sandboxes[parent.ID], r.sandboxes[winner.ID]
	if p == nil || w == nil {
		r.mu.Unlock()
		return runtime.Handle{}, errors.New("fake: no such sandbox")
	}
	delete(r.sandboxes, winner.ID)
	w.mu.Lock()
	w.ID = parent.ID
	w.mu.Unlock()
	r.sandboxes[parent.ID] = w
	r.mu.Unlock()
	p.client.Close()
	os.RemoveAll(r.layerDir(p.Layer))
	return r.handle(w), nil
}

// Rekeyed is the handle Swap returns: the winner's under the parent's id.
func (r *Runtime) Rekeyed(parent, winner runtime.Handle) runtime.Handle {
	nh := winner
	nh.ID = parent.ID
	nh.LayerID = winner.Layer()
	return nh
}

// UpperDir is the sandbox's layer directory.
func (r *Runtime) UpperDir(h runtime.Handle) string { return r.layerDir(h.Layer()) }

// LowerDirs is an empty "image".
func (r *Runtime) LowerDirs(runtime.Handle) ([]string, error) {
	return []string{filepath.Join(r.dir, "lower")}, nil
}

// Freeze marks the sandbox frozen.
func (r *Runtime) Freeze(ctx context.Context, h runtime.Handle) error {
	return r.setFrozen(ctx, "Freeze", h, true)
}

// Thaw marks the sandbox thawed.
func (r *Runtime) Thaw(ctx context.Context, h runtime.Handle) error {
	return r.setFrozen(ctx, "Thaw", h, false)
}

func (r *Runtime) setFrozen(ctx context.Context, method string, h runtime.Handle, v bool) error {
	if err := r.fault(ctx, method, h.ID); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[h.ID]
	if sb == nil {
		return errors.New("fake: no such sandbox")
	}
	sb.frozen = v
	return nil
}

func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, 0o644)
		}
		return nil
	})
}

// dial connects to the sandbox's fake agent over a unix socketpair (which can carry descriptors).
func (r *Runtime) dial(sb *Sandbox) (net.Conn, error) {
	r.mu.Lock()
	live := r.sandboxes[sb.id()] == sb && !sb.dead
	r.mu.Unlock()
	if !live {
		return nil, errors.New("fake: connection refused")
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "fake-agent")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			return nil, err
		}
		conns[i] = c.(*net.UnixConn)
	}
	go r.serve(sb, conns[1])
	return conns[0], nil
}

// serve is the fake agent's side of one connection.
func (r *Runtime) serve(sb *Sandbox, c *net.UnixConn) {
	defer c.Close()
	// closed ends when the server hangs up: it cancels what this connection's calls wait for.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var pending []byte
	var files []*os.File
	buf, oob := make([]byte, 64<<10), make([]byte, unix.CmsgSpace(4*4))
	lines := make(chan []byte)
	fileq := make(chan *os.File, 8)
	go func() {
		defer close(lines)
		defer cancel()
		for {
			n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
			n, oobn = max(n, 0), max(oobn, 0) // a failed read may say -1
			if oobn > 0 {
				if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
					for _, m := range msgs {
						if fds, perr := unix.ParseUnixRights(&m); perr == nil {
							for _, fd := range fds {
								fileq <- os.NewFile(uintptr(fd), "passed")
							}
						}
					}
				}
			}
			pending = append(pending, buf[:n]...)
			for {
				i := bytes.IndexByte(pending, '\n')
				if i < 0 {
					break
				}
				line := append([]byte(nil), pending[:i]...)
				pending = pending[i+1:]
				lines <- line
			}
			if err != nil {
				return
			}
		}
	}()
	w := bufio.NewWriter(c)
	send := func(ev agent.Event) {
		b, _ := json.Marshal(ev)
		w.Write(append(b, '\n')) //nolint:errcheck // a gone server stops reading
		w.Flush()                //nolint:errcheck
	}
	for line := range lines {
		var req agent.Request
		if err := json.Unmarshal(line, &req); err != nil {
			send(agent.Event{Type: "error", Message: "bad request"})
			continue
		}
		var f *os.File
		select {
		case f = <-fileq:
			files = append(files, f)
		default:
		}
		if err := r.fault(ctx, "agent:"+req.Op, sb.id()); err != nil {
			send(agent.Event{Type: "error", Message: err.Error()})
			if f != nil {
				f.Close()
			}
			continue
		}
		send(r.handleReq(ctx, sb, req, f, send))
		if f != nil {
			f.Close()
		}
	}
}

func (r *Runtime) handleReq(ctx context.Context, sb *Sandbox, req agent.Request, f *os.File, send func(agent.Event)) agent.Event {
	switch req.Op {
	case agent.OpPing, agent.OpStart, agent.OpWarm:
		return agent.Event{Type: "ok", Pid: sb.Pid}
	case agent.OpForkCheck:
		sb.mu.Lock()
		_, hooks := sb.vars["fork_hooks"] // the fake's stand-in for a session that registered at-fork handlers
		sb.mu.Unlock()
		return agent.Event{Type: "ok", ForkHooks: hooks}
	case agent.OpReplaceStuck: // the fake's interpreter answers or fails at once: never stuck
		return agent.Event{Type: "ok"}
	case agent.OpInterrupt:
		n := sb.calls.Interrupt(req.What)
		return agent.Event{Type: "ok", Interrupted: &n}
	case agent.OpRunCode:
		ctx, end := sb.calls.Begin(ctx, agent.OpRunCode)
		defer end()
		ev := r.runCode(ctx, sb, strings.TrimSpace(req.Code), send)
		ev.WasInterrupted = errors.Is(context.Cause(ctx), agent.ErrInterrupted)
		return ev
	case agent.OpExec:
		ctx, end := sb.calls.Begin(ctx, agent.OpExec)
		defer end()
		cmd := req.Cmd
		if cmd == "" {
			cmd = strings.Join(req.Argv, " ")
		}
		switch {
		case strings.HasPrefix(cmd, "wait "):
			if err := r.wait(ctx, strings.TrimPrefix(cmd, "wait ")); err != nil {
				if errors.Is(context.Cause(ctx), agent.ErrInterrupted) {
					return agent.Event{Type: "exit", ExitCode: -1, WasInterrupted: true}
				}
				return agent.Event{Type: "error", Message: err.Error()}
			}
			return agent.Event{Type: "exit"}
		case strings.HasPrefix(cmd, "exit "):
			n, _ := strconv.Atoi(strings.TrimPrefix(cmd, "exit "))
			return agent.Event{Type: "exit", ExitCode: n}
		}
		send(agent.Event{Type: "stdout", Data: cmd + "\n"})
		return agent.Event{Type: "exit", Stdout: cmd + "\n"}
	case agent.OpSnapshot:
		if f == nil {
			return agent.Event{Type: "error", Message: "snapshot_repl needs a pipe"}
		}
		sb.mu.Lock()
		b, _ := json.Marshal(session{Vars: sb.vars, Count: sb.count})
		_, numpy := sb.vars["np"] // the fake's stand-in for a session holding numpy arrays
		sb.mu.Unlock()
		if _, err := f.Write(b); err != nil {
			return agent.Event{Type: "error", Message: err.Error()}
		}
		ev := agent.Event{Type: "ok"}
		if numpy {
			ev.Preload = []string{"numpy"}
		}
		return ev
	case agent.OpRestore:
		if f == nil {
			return agent.Event{Type: "error", Message: "restore_repl needs a file"}
		}
		b, err := io.ReadAll(f)
		if err != nil {
			return agent.Event{Type: "error", Message: err.Error()}
		}
		var s session
		if err := json.Unmarshal(b, &s); err != nil {
			return agent.Event{Type: "error", Message: "corrupt session: " + err.Error()}
		}
		sb.mu.Lock()
		sb.vars, sb.count = s.Vars, s.Count
		if sb.vars == nil {
			sb.vars = map[string]string{}
		}
		sb.mu.Unlock()
		return agent.Event{Type: "ok"}
	}
	return agent.Event{Type: "error", Message: "fake agent: unknown op " + req.Op}
}

type session struct {
	Vars  map[string]string `json:"vars"`
	Count int               `json:"count"`
}

func (r *Runtime) wait(ctx context.Context, gate string) error {
	select {
	case <-r.gate(gate):
		return nil
	case <-ctx.Done():
		return errors.New("interrupted")
	}
}

func (r *Runtime) runCode(ctx context.Context, sb *Sandbox, code string, send func(agent.Event)) agent.Event {
	sb.mu.Lock()
	sb.count++
	n := sb.count
	sb.mu.Unlock()
	res := agent.Event{Type: "result", ExecutionCount: n}
	fail := func(name, value string) agent.Event {
		res.Error = &agent.ExecError{Name: name, Value: value}
		return res
	}
	switch {
	case strings.HasPrefix(code, "wait "):
		if err := r.wait(ctx, strings.TrimPrefix(code, "wait ")); err != nil {
			return fail("KeyboardInterrupt", "")
		}
	case strings.HasPrefix(code, "print "):
		out := strings.TrimPrefix(code, "print ") + "\n"
		send(agent.Event{Type: "stdout", Data: out})
		res.Stdout = out
	case strings.HasPrefix(code, "raise "):
		return fail("Exception", strings.TrimPrefix(code, "raise "))
	case strings.Contains(code, " = "):
		k, v, _ := strings.Cut(code, " = ")
		sb.mu.Lock()
		sb.vars[k] = v
		sb.mu.Unlock()
	case code != "":
		sb.mu.Lock()
		v, ok := sb.vars[code]
		sb.mu.Unlock()
		if !ok {
			return fail("NameError", fmt.Sprintf("name '%s' is not defined", code))
		}
		res.Value = &v
	}
	return res
}

// Handle is the runtime handle of the sandbox as it is now.
func (sb *Sandbox) Handle() runtime.Handle {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	h := runtime.Handle{ID: sb.ID, FamilyID: sb.Family, AgentPid: sb.Pid, InitPid: 1, AgentNsPid: 2}
	if sb.Layer != sb.ID {
		h.LayerID = sb.Layer
	}
	return h
}

// GateChan is the channel gate name closes when opened (for Fault functions that wait on a gate).
func (r *Runtime) GateChan(name string) <-chan struct{} { return r.gate(name) }

var _ runtime.Healer = (*Runtime)(nil)

// Lost implements runtime.Healer: the sandboxes Kill marked dead.
func (r *Runtime) Lost() []runtime.Lost {
	r.mu.Lock()
	var dead []*Sandbox
	for _, sb := range r.sandboxes {
		if sb.dead {
			dead = append(dead, sb)
		}
	}
	r.mu.Unlock()
	out := make([]runtime.Lost, 0, len(dead))
	for _, sb := range dead {
		out = append(out, runtime.Lost{Handle: sb.Handle(), Reason: "its agent died"})
	}
	return out
}

// Revive implements runtime.Healer: the sandbox lives again on its layer, with a new agent pid and a fresh
// interpreter (no variables).
func (r *Runtime) Revive(ctx context.Context, h runtime.Handle, spec runtime.Spec) (runtime.Handle, error) {
	if err := r.fault(ctx, "Revive", h.ID); err != nil {
		return runtime.Handle{}, err
	}
	r.mu.Lock()
	sb := r.sandboxes[h.ID]
	if sb == nil {
		r.mu.Unlock()
		return runtime.Handle{}, fmt.Errorf("fake: no sandbox %s", h.ID)
	}
	r.nextPid++
	sb.dead = false
	pid := r.nextPid
	r.mu.Unlock()
	sb.mu.Lock()
	sb.Pid, sb.vars, sb.count = pid, map[string]string{}, 0
	sb.mu.Unlock()
	return sb.Handle(), nil
}

var _ runtime.Reclaimer = (*Runtime)(nil)

// Reclaim implements runtime.Reclaimer: it forgets every sandbox that no running handle names (by id and pid),
// counting the live ones as processes, and removes every layer directory that neither a running handle nor
// owned.Layers names. Save copies' cgroups left with LeaveSaveKept count as cgroups, and as kept for those of
// running sandboxes.
func (r *Runtime) Reclaim(ctx context.Context, owned runtime.Owned) (runtime.Reclaimed, error) {
	var res runtime.Reclaimed
	if err := r.fault(ctx, "Reclaim", ""); err != nil {
		return res, err
	}
	pids, keep := map[string]int{}, map[string]bool{}
	for _, h := range owned.Running {
		pids[h.ID] = h.AgentPid
		keep[h.Layer()] = true
	}
	for _, l := range owned.Layers {
		keep[l] = true
	}
	r.mu.Lock()
	for id, kept := range r.keptSaves {
		if _, running := pids[id]; running {
			if res.KeptSaves == nil {
				res.KeptSaves = map[string]int64{}
			}
			res.KeptSaves[id] = kept
		}
		res.Cgroups++
	}
	r.keptSaves = nil
	for id, sb := range r.sandboxes {
		if !sb.dead && pids[id] == sb.Pid {
			continue
		}
		if !sb.dead {
			res.Processes++
		}
		delete(r.sandboxes, id)
		sb.client.Close()
	}
	r.mu.Unlock()
	ents, err := os.ReadDir(filepath.Join(r.dir, "layers"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return res, err
	}
	for _, e := range ents {
		if keep[e.Name()] {
			continue
		}
		if err := os.RemoveAll(r.layerDir(e.Name())); err != nil {
			return res, err
		}
		res.Layers++
	}
	return res, nil
}

// Layers lists the layer directories that exist, for leak checks.
func (r *Runtime) Layers() []string {
	ents, _ := os.ReadDir(filepath.Join(r.dir, "layers"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
