// Package agent owns the code that runs inside a sandbox: the agent process that holds the sandbox's
// namespaces, sets up its root file system, runs shell commands and drives the persistent Python interpreter
// (repl.py, embedded), and the client the server uses to talk to it. Server and agent speak JSON lines over an
// abstract unix socket in the sandbox's network namespace: one request line, then events, the last of which has
// a terminal type ("result", "exit", "ok" or "error"). A connection may carry many requests in turn.
package agent

import (
	"encoding/json"
	"os"
)

// SocketName is the abstract unix socket the agent listens on inside the sandbox's network namespace.
const SocketName = "ramify-agent"

// Request is one call to the agent as it travels: the server builds it through the typed calls (calls.go), a
// forked interpreter sends attach_repl.
type Request struct {
	Op string `json:"op"` // the op* constants in calls.go

	// start (the sandbox's environment); exec and run_code (added for that call only)
	Env map[string]string `json:"env,omitempty"`
	Cwd string            `json:"cwd,omitempty"`
	// start: the sandbox's whole CPUs (its vCPU quota), which the thread pools of numeric libraries default to
	CPUs int `json:"cpus,omitempty"`
	// start: the interpreter attaching was forked from a fresh one (a family's zygote), not from a parent
	// sandbox's: it gets the sandbox's env and cwd as a fresh interpreter would
	Fresh bool `json:"fresh,omitempty"`

	// run_code
	Code string `json:"code,omitempty"`

	// exec
	Cmd   string   `json:"cmd,omitempty"`
	Argv  []string `json:"argv,omitempty"`
	Stdin string   `json:"stdin,omitempty"`

	// session: a PTY (Tty) of Rows x Cols, or pipes
	Tty  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`

	// run_code and exec: seconds, 0 = no limit
	TimeoutS float64 `json:"timeout_s,omitempty"`

	// fork_repl: one target per child sandbox. Handover (a zygote's, one target): the interpreter itself becomes
	// the target's, unforked, and this agent forgets it (Client.HandOverInterpreter).
	Targets  []ForkTarget `json:"targets,omitempty"`
	Handover bool         `json:"handover,omitempty"`

	// snapshot_repl and restore_repl: Stream means the session travels as a session stream through the pipe
	// sent with the request (Client.roundTripWithFiles); else restore_repl loads a saved session from Dir, inside the sandbox
	// (snapshots made before session streams).
	Stream bool   `json:"stream,omitempty"`
	Dir    string `json:"dir,omitempty"`
	// restore_repl of a stored file: the checksum its interpreter computes as it reads ("crc32c", "sha256").
	Sum string `json:"sum,omitempty"`
	// snapshot_repl: a second descriptor comes with the stream, the read end of a pipe on which the copy the
	// interpreter forks to save its session waits until the server has moved it into a memory budget of its own
	// (one byte; end of file: it saves where it is). A "save_copy" event gives the server the copy's pid, in
	// the family's PID namespace, before the answer.
	Budget bool `json:"budget,omitempty"`

	// preload_repl: packages the interpreter imports ahead of a session that needs them
	Modules []string `json:"modules,omitempty"`
	// replace_stuck_repl: how long the interpreter's save or fork may still take before it is killed
	GraceMs int `json:"grace_ms,omitempty"`
	// files are the descriptors that came with the request (SCM_RIGHTS); file is the first, if any.
	files []*os.File
	file  *os.File

	// attach_repl (sent by a forked interpreter to its child sandbox's agent)
	Token string `json:"token,omitempty"`
	Pid   int    `json:"pid,omitempty"`

	// interrupt: InterruptAll, InterruptRunCode or InterruptExec
	What string `json:"what,omitempty"`
}

// ForkTarget tells a forked interpreter which sandbox to become.
type ForkTarget struct {
	AgentPid int    `json:"agent_pid"` // the child agent's pid in the family's PID namespace
	Gid      int    `json:"gid"`       // the child sandbox's group (SandboxGID), which the forked interpreter takes
	Token    string `json:"token"`     // proves to the child agent that this interpreter is the one expected
	Cwd      string `json:"cwd"`
	// Cgroup names the child's cgroup in the forked interpreter's report when the move it was told of did not
	// happen (the supervisor refused it the child's group, which it allows only from the child's cgroup).
	Cgroup string `json:"cgroup"`
	// NS is the index, among the descriptors sent with fork_repl, of the first of five: the child agent's IPC,
	// UTS, network and mount namespaces (in that order), which the forked interpreter joins (it cannot open them
	// through /proc, the agent being out of its reach), and the read end of a pipe to which the server writes
	// one byte once it has moved the forked interpreter into the child's cgroup. The forked interpreter blocks
	// on that pipe before it enters the sandbox; end of file without the byte means the fork failed.
	NS int `json:"ns"`
}

// ExecError describes an exception raised by run_code.
type ExecError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Result is one rich result of run_code, as a Jupyter kernel publishes it: Type is "execute_result" (the cell's
// trailing expression) or "display_data" (display(), plt.show(), a figure left open); Data maps a mime type to
// its value (binary formats base64; text/plain always present).
type Result struct {
	Type string                     `json:"type"`
	Data map[string]json.RawMessage `json:"data"`
}

// size is the length of r's data in JSON, for the results limit.
func (r Result) size() int {
	n := 2
	for k, v := range r.Data {
		n += len(k) + len(v) + 4
	}
	return n
}

// Event is one line the agent sends back.
type Event struct {
	Type string `json:"type"` // stdout, stderr, display_data, result, exit, ok, error, ready

	Data string `json:"data,omitempty"`

	// result (run_code)
	Stdout         string     `json:"stdout,omitempty"`
	Stderr         string     `json:"stderr,omitempty"`
	Value          *string    `json:"value,omitempty"`
	Error          *ExecError `json:"error,omitempty"`
	ExecutionCount int        `json:"execution_count,omitempty"`
	// result (run_code): the cell's rich results in order; display_data: the one just published
	Results []Result `json:"results,omitempty"`

	// exit (exec)
	ExitCode int  `json:"exit_code"`
	TimedOut bool `json:"timed_out,omitempty"`
	// result and exit: the call was stopped by an interrupt
	WasInterrupted bool `json:"interrupted,omitempty"`

	// ok (ping, start, fork_repl) and error
	Pid     int    `json:"pid,omitempty"`
	ReplPid int    `json:"repl_pid,omitempty"`
	Pids    []int  `json:"pids,omitempty"`
	Message string `json:"message,omitempty"`
	// error: the call needed the interpreter, which had exited (killed, out of memory) or died during it: its
	// state is lost, and the next run starts a fresh one (the client's error is ErrInterpreterLost)
	Lost bool `json:"interpreter_lost,omitempty"`
	// error (fork_repl): the sandbox's tasks limit was full, so the interpreter could not fork (the client's error
	// is ErrTasksFull)
	TasksFull bool `json:"tasks_full,omitempty"`

	// ok (interrupt)
	Interrupted *Interrupted `json:"interrupted_calls,omitempty"`

	// snapshot_repl and restore_repl: what could not be saved or loaded, by name
	Skipped []Skipped `json:"skipped,omitempty"`
	// snapshot_repl: the packages loading the session will import (only numpy is looked for)
	Preload []string `json:"preload,omitempty"`
	// restore_repl of a stored file: its size and SHA-256 as the interpreter read it
	Read *StreamRead `json:"read,omitempty"`

	// ok (fork_check_repl): the session registered at-fork handlers a fork made ahead of its call must not run
	ForkHooks bool `json:"fork_hooks,omitempty"`

	// ok (replace_stuck_repl): the interpreter was killed, its save or fork still unanswered after the grace
	Replaced bool `json:"replaced,omitempty"`
}

// StreamRead is what an interpreter read of a session stream given as the stored file: every byte of the file,
// in order, checksummed as it went in the algorithm asked for (Request.Sum; snapstore.Sum's hex forms).
type StreamRead struct {
	Bytes  int64  `json:"bytes"`
	CRC32C string `json:"crc32c,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
}

// Skipped names something a pause could not save (a variable, a process) and why.
type Skipped struct {
	Name   string `json:"name"`
	Type   string `json:"type,omitempty"`
	Reason string `json:"reason"`
}

// Terminal reports whether e ends a response.
func (e *Event) Terminal() bool {
	switch e.Type {
	case "result", "exit", "ok", "error":
		return true
	}
	return false
}

// replMsg is what the agent and repl.py exchange.
type replMsg struct {
	Type           string                     `json:"type"`
	Data           string                     `json:"data,omitempty"`
	Value          *string                    `json:"value,omitempty"`
	Error          *ExecError                 `json:"error,omitempty"`
	ExecutionCount int                        `json:"execution_count,omitempty"`
	Pid            int                        `json:"pid,omitempty"`
	Pids           []int                      `json:"pids,omitempty"`
	Skipped        []Skipped                  `json:"skipped,omitempty"`
	Preload        []string                   `json:"preload,omitempty"`
	Read           *StreamRead                `json:"read,omitempty"`
	PreloadHolds   *bool                      `json:"preload_holds,omitempty"`
	ForkHooks      bool                       `json:"fork_hooks,omitempty"`
	Bundle         map[string]json.RawMessage `json:"bundle,omitempty"` // display_data and execute_result
	Op             string                     `json:"op,omitempty"`
	Token          string                     `json:"token,omitempty"`
	Raw            json.RawMessage            `json:"-"`
}
