package agent

import (
	"context"
	"fmt"
	"os"
	"time"
)

// The agent protocol's operations, as the server calls them: one method and one request type per operation.
// The op names are the wire's; besides the client, only agents (Agent.handle, the fake runtime's) use them.
const (
	OpPing         = "ping"
	OpStart        = "start"
	OpRunCode      = "run_code"
	OpExec         = "exec"
	OpInterrupt    = "interrupt"
	OpSnapshot     = "snapshot_repl"
	OpRestore      = "restore_repl"
	OpFork         = "fork_repl"
	OpPreload      = "preload_repl"
	OpWarm         = "warm_repl"
	OpForkCheck    = "fork_check_repl"
	OpReplaceStuck = "replace_stuck_repl"
	OpAttach       = "attach_repl" // sent by a forked interpreter (repl.py), never by the server
	OpSession      = "session"     // an interactive session (session.go): the connection is then the session's
)

// Pong is what a ping answers: the agent's and its interpreter's pids in the family's PID namespace.
type Pong struct {
	Pid     int
	ReplPid int // 0 when no interpreter runs
}

// Ping checks that the agent answers. It is the only call a client retries on a fresh connection after a failure
// that leaves unknown whether the agent received it.
func (c *Client) Ping(ctx context.Context) (Pong, error) {
	ev, err := c.roundTrip(ctx, Request{Op: OpPing}, nil)
	if err != nil {
		return Pong{}, err
	}
	return Pong{Pid: ev.Pid, ReplPid: ev.ReplPid}, nil
}

// StartRequest makes a spawned (or claimed warm) agent the sandbox's: its environment and working directory,
// which the interpreter and every exec get.
type StartRequest struct {
	Env  map[string]string
	Cwd  string
	CPUs int // the sandbox's whole vCPUs (see ThreadEnv); 0 leaves the libraries' own defaults
	// Fresh: the interpreter that attaches (Config.ReplToken) is a fresh one, a zygote's (handed over); it is given
	// Env and Cwd, which an interpreter forked from a parent sandbox is not (it keeps its parent's).
	Fresh bool
}

// Start sends a StartRequest and waits for the interpreter to be ready.
func (c *Client) Start(ctx context.Context, r StartRequest) error {
	_, err := c.roundTrip(ctx, Request{Op: OpStart, Env: r.Env, Cwd: r.Cwd, CPUs: r.CPUs, Fresh: r.Fresh}, nil)
	return err
}

// RunCodeRequest runs Python in the sandbox's persistent interpreter.
type RunCodeRequest struct {
	Code     string
	Env      map[string]string // set in the interpreter's os.environ for this call only
	TimeoutS float64           // 0 = no limit; counts from the call's arrival, time queued behind another call included
}

// RunCode runs code; onEvent gets its stdout and stderr as they come; the answer is the "result" event.
func (c *Client) RunCode(ctx context.Context, r RunCodeRequest, onEvent func(Event)) (Event, error) {
	return c.roundTrip(ctx, Request{Op: OpRunCode, Code: r.Code, Env: r.Env, TimeoutS: r.TimeoutS}, onEvent)
}

// ExecRequest runs a command: Argv as is, or Cmd with /bin/sh -c.
type ExecRequest struct {
	Cmd      string
	Argv     []string
	Env      map[string]string // on top of the sandbox's
	Cwd      string            // default: the sandbox's
	Stdin    string
	TimeoutS float64 // 0 = no limit
}

// Exec runs a command; onEvent gets its output as it comes; the answer is the "exit" event.
func (c *Client) Exec(ctx context.Context, r ExecRequest, onEvent func(Event)) (Event, error) {
	return c.roundTrip(ctx, Request{Op: OpExec, Cmd: r.Cmd, Argv: r.Argv, Env: r.Env, Cwd: r.Cwd, Stdin: r.Stdin,
		TimeoutS: r.TimeoutS}, onEvent)
}

// What an interrupt stops.
const (
	InterruptAll     = ""         // every run_code and exec call in flight
	InterruptRunCode = "run_code" // run_code calls only
	InterruptExec    = "exec"     // exec calls only
)

// InterruptRequest stops the calls in flight when it arrives (running or queued for the interpreter): run_code
// gets a KeyboardInterrupt (the interpreter is killed if it does not stop within the grace period, as at a
// timeout), exec's command and everything it started are killed. Calls that arrive later run normally.
type InterruptRequest struct {
	What string // InterruptAll, InterruptRunCode or InterruptExec
}

// Interrupted counts the calls an interrupt stopped.
type Interrupted struct {
	RunCode int `json:"run_code"`
	Exec    int `json:"exec"`
}

// Interrupt sends an InterruptRequest.
func (c *Client) Interrupt(ctx context.Context, r InterruptRequest) (Interrupted, error) {
	ev, err := c.roundTrip(ctx, Request{Op: OpInterrupt, What: r.What}, nil)
	if err != nil {
		return Interrupted{}, err
	}
	if ev.Interrupted == nil {
		return Interrupted{}, nil
	}
	return *ev.Interrupted, nil
}

// SnapshotSession has the interpreter write its session (variables, imports) as a session stream to w, which it
// takes (and closes once sent). The answer lists what could not be saved, and the packages loading the stream
// will import (see Preload). The interpreter saves from a copy of itself that it forks for the save; with moved
// (the read end of a pipe, which it takes) that copy waits until the caller has moved it into a memory budget of
// its own: onCopy gets the copy's pid (in the family's PID namespace) as soon as it is forked, and the caller
// then writes one byte to the pipe (or closes it, and the copy saves where it is).
func (c *Client) SnapshotSession(ctx context.Context, w, moved *os.File, onCopy func(pid int)) (skipped []Skipped, preload []string, err error) {
	req, files := Request{Op: OpSnapshot, Stream: true}, []*os.File{w}
	var on func(Event)
	if moved != nil {
		req.Budget, files = true, append(files, moved)
		on = func(ev Event) {
			if ev.Type == "save_copy" && ev.Pid > 0 && onCopy != nil {
				onCopy(ev.Pid)
			}
		}
	}
	ev, err := c.roundTripWithFiles(ctx, req, files, on)
	return ev.Skipped, ev.Preload, err
}

// ReplaceStuck has the agent kill its interpreter if the save or fork the interpreter serves has not ended within
// grace: the caller gave up on it for not answering (see repl.replaceStuck). It answers at once when none runs,
// and reports whether it killed one. It does not wait behind the interpreter's current call, and runs even
// if ctx has ended (the caller's work, given up), within grace and a margin.
func (c *Client) ReplaceStuck(ctx context.Context, grace time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace+10*time.Second)
	defer cancel()
	ev, err := c.roundTrip(ctx, Request{Op: OpReplaceStuck, GraceMs: int(grace.Milliseconds())}, nil)
	return ev.Replaced, err
}

// Preload has the interpreter import modules ahead of a session that will need them (a zygote kept for resumes
// of such sessions); nothing of its session changes.
func (c *Client) Preload(ctx context.Context, modules []string) error {
	_, err := c.roundTrip(ctx, Request{Op: OpPreload, Modules: modules}, nil)
	return err
}

// Warm has the interpreter run a cell through what a run does, leaving no trace in its session: a fork child
// made ahead of its fork takes the copy-on-write faults of its first run while it waits for the fork.
func (c *Client) Warm(ctx context.Context) error {
	_, err := c.roundTrip(ctx, Request{Op: OpWarm}, nil)
	return err
}

// ForkHooks reports whether the interpreter's session registered at-fork handlers that children made ahead of
// a fork must not run (repl.py's _fork_hooks: handlers outside the standard library that run in the parent, or
// session code's for its children).
func (c *Client) ForkHooks(ctx context.Context) (bool, error) {
	ev, err := c.roundTrip(ctx, Request{Op: OpForkCheck}, nil)
	return ev.ForkHooks, err
}

// RestoreSession has the interpreter load a session stream from r, which it takes. The answer lists what could
// not be loaded and, when r is the stored file itself, what the interpreter read of it, checksummed with sum
// ("crc32c" or "sha256", as the snapshot's manifest has it): nil from a pipe, or from an interpreter that does
// not say.
func (c *Client) RestoreSession(ctx context.Context, r *os.File, sum string) ([]Skipped, *StreamRead, error) {
	ev, err := c.roundTripWithFiles(ctx, Request{Op: OpRestore, Stream: true, Sum: sum}, []*os.File{r}, nil)
	return ev.Skipped, ev.Read, err
}

// RestoreSessionDir has the interpreter load a session saved in dir inside the sandbox (the format of snapshots
// made before session streams).
func (c *Client) RestoreSessionDir(ctx context.Context, dir string) ([]Skipped, error) {
	ev, err := c.roundTrip(ctx, Request{Op: OpRestore, Dir: dir}, nil)
	return ev.Skipped, err
}

// ForkInterpreter forks the sandbox's interpreter once per target; nsFiles are the targets' namespace descriptors
// (ForkTarget.NS indexes them), which it takes. It answers the forked interpreters' pids, in target order.
func (c *Client) ForkInterpreter(ctx context.Context, targets []ForkTarget, nsFiles []*os.File) ([]int, error) {
	return c.forkInterpreter(ctx, Request{Op: OpFork, Targets: targets}, nsFiles)
}

// HandOverInterpreter has a zygote's interpreter become target's itself, as a fork child would but unforked (a
// zygote serves one sandbox): it answers with its own pid, waits for the "moved" pipe like a fork child, and this
// agent forgets it without ending it. nsFiles are as for ForkInterpreter.
func (c *Client) HandOverInterpreter(ctx context.Context, target ForkTarget, nsFiles []*os.File) ([]int, error) {
	return c.forkInterpreter(ctx, Request{Op: OpFork, Targets: []ForkTarget{target}, Handover: true}, nsFiles)
}

func (c *Client) forkInterpreter(ctx context.Context, req Request, nsFiles []*os.File) ([]int, error) {
	targets := req.Targets
	ev, err := c.roundTripWithFiles(ctx, req, nsFiles, nil)
	if err != nil {
		return nil, err
	}
	if len(ev.Pids) != len(targets) {
		return nil, fmt.Errorf("fork interpreter: %d pids for %d targets", len(ev.Pids), len(targets))
	}
	return ev.Pids, nil
}
