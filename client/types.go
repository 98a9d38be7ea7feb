package client

import (
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// Sandbox statuses.
const (
	StatusCreating = "creating"
	StatusRunning  = "running"
	StatusPausing  = "pausing"
	StatusPaused   = "paused"
	StatusResuming = "resuming"
	StatusFailed   = "error"
)

// Sandbox is the API's sandbox object.
type Sandbox struct {
	ID        string            `json:"id"`
	Status    string            `json:"status"`
	IP        string            `json:"ip"`
	Hostname  string            `json:"hostname"`
	VCPU      float64           `json:"vcpu"`
	MemMiB    int               `json:"mem_mib"`
	MaxProcs  int               `json:"max_procs"`
	DiskMiB   int               `json:"disk_mib"`
	Egress    []string          `json:"egress"` // nil: the server's default policy (public internet only)
	Ingress   Ingress           `json:"ingress"`
	Shape     string            `json:"shape"`
	TimeoutS  int               `json:"timeout_s"`
	OnTimeout string            `json:"on_timeout"`
	ExpiresAt *time.Time        `json:"expires_at"`
	Cwd       string            `json:"cwd"`
	Metadata  map[string]string `json:"metadata"`
	CreatedAt time.Time         `json:"created_at"`
	// FamilyID groups the sandboxes of one fork lineage.
	FamilyID string `json:"family_id"`
	// ParentID is the sandbox this one was forked from ("" when it was created, not forked).
	ParentID string `json:"parent_id,omitempty"`
	// ForkedFrom is set by the server for forked sandboxes (see docs/api.md).
	ForkedFrom string `json:"forked_from,omitempty"`
	// Error holds the reason when Status is "error".
	Error string `json:"error"`
	// Pause reports the last pause and resume (nil before the first pause).
	Pause *PauseInfo `json:"pause,omitempty"`
	// Progress is how far the pause or resume in flight has got (nil unless pausing or resuming).
	Progress *Progress `json:"progress,omitempty"`
	// Template is the template the sandbox was created from ("" when none).
	Template string `json:"template,omitempty"`
	// Image is the image the sandbox runs on ("default" for the default image).
	Image string `json:"image"`
	// Usage is the sandbox's resource use now: set by Get for a running sandbox only.
	Usage *Usage `json:"usage,omitempty"`
	// SSH is the sandbox's SSH access: its authorized keys and, when the server runs its SSH server, how to
	// connect (nil when it has no keys and the server no SSH server).
	SSH *SSHInfo `json:"ssh,omitempty"`
}

// SSHInfo is a sandbox's SSH access.
type SSHInfo struct {
	Keys []SSHKey `json:"keys"`
	// Command is the ssh command line that connects ("ssh -p 2222 sbx_...@host"); empty without an SSH server.
	Command string `json:"command,omitempty"`
	// HostKey is the SSH server's host key, KnownHosts its line for a known_hosts file.
	HostKey    string `json:"host_key,omitempty"`
	KnownHosts string `json:"known_hosts,omitempty"`
}

// SSHKey describes one authorized key.
type SSHKey struct {
	Type        string `json:"type"`
	Fingerprint string `json:"fingerprint"`
	Comment     string `json:"comment,omitempty"`
}

// Usage is a running sandbox's resource use.
type Usage struct {
	MemBytes   uint64  `json:"mem_bytes"`
	CPUSeconds float64 `json:"cpu_seconds"`
	Pids       uint64  `json:"pids"`
	OOMKills   uint64  `json:"oom_kills"`
	// DiskBytes counts against DiskMiB; nil when the server's layer driver does not account per sandbox.
	DiskBytes *int64 `json:"disk_bytes"`
}

// Skipped names something a pause could not save (a variable, a process), or a resume could not restore.
type Skipped struct {
	Name   string `json:"name"`
	Type   string `json:"type,omitempty"`
	Reason string `json:"reason"`
}

// Progress is how far a pause or resume in flight has got: the part being moved ("session", "files",
// "commit"), the bytes the snapshot store was given (a pause) or handed out (a resume) so far, and for a resume
// the snapshot's size.
type Progress struct {
	Phase      string  `json:"phase"`
	Bytes      int64   `json:"bytes"`
	TotalBytes int64   `json:"total_bytes,omitempty"`
	ElapsedMs  float64 `json:"elapsed_ms"`
}

// PauseInfo is what the last pause and resume of a sandbox reported.
type PauseInfo struct {
	NotSaved      []Skipped  `json:"not_saved,omitempty"`
	NotRestored   []Skipped  `json:"not_restored,omitempty"`
	SnapshotBytes int64      `json:"snapshot_bytes,omitempty"`
	PauseMs       float64    `json:"pause_ms,omitempty"`
	ResumeMs      float64    `json:"resume_ms,omitempty"`
	PausedAt      *time.Time `json:"paused_at,omitempty"`
	// Error is why the last pause (the sandbox runs on) or the last resume (it is paused again) failed.
	Error string `json:"error,omitempty"`
	// Warning: the resumed sandbox's files take more than its disk_mib (a snapshot of an older version);
	// its writes fail until it frees space.
	Warning string `json:"warning,omitempty"`
}

// CreateRequest is the body of POST /v1/sandboxes. Zero fields take the server's defaults.
type CreateRequest struct {
	VCPU      float64           `json:"vcpu,omitempty"`
	MemMiB    int               `json:"mem_mib,omitempty"`
	MaxProcs  int               `json:"max_procs,omitempty"`
	DiskMiB   int               `json:"disk_mib,omitempty"`
	TimeoutS  int               `json:"timeout_s,omitempty"`
	OnTimeout string            `json:"on_timeout,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// Egress is the outbound allowlist (CIDRs, IPs, hostnames, optionally with :port): nil means the server's
	// default policy (the public internet), an empty non-nil slice means no outbound traffic at all.
	Egress []string `json:"-"`
	// IngressEnabled makes the sandbox's ports reachable over HTTP: through the server's ingress listener
	// (Sandbox.Ingress.URL) and through the API (Client.PortURL). Fork children inherit it.
	IngressEnabled bool `json:"ingress_enabled,omitempty"`
	// Template starts the sandbox from a template (SaveTemplate): its files and interpreter session, and its
	// spec for every field left zero.
	Template string `json:"template,omitempty"`
	// Image names the image the sandbox runs on (BuildImage); "" is the default image.
	Image string `json:"image,omitempty"`
	// SSHPubkeys are authorized_keys lines of the keys that may ssh into the sandbox (see docs/ssh.md).
	SSHPubkeys []string `json:"ssh_pubkeys,omitempty"`
}

// Ingress says whether a sandbox's ports are reachable over HTTP, and where ("{port}" stands for the port).
type Ingress struct {
	Enabled bool `json:"enabled"`
	// URLTemplate is the ingress listener's URL ("http://{port}-<id without sbx_>.localhost:7080/"), no key
	// needed; empty when the server has no ingress listener.
	URLTemplate string `json:"url_template,omitempty"`
	// PathTemplate is the API's route ("/v1/sandboxes/<id>/ports/{port}/"), with the API key.
	PathTemplate string `json:"path_template,omitempty"`
}

// URL is the ingress listener's URL of port, or "" when there is none (ingress off, or no listener).
func (g Ingress) URL(port int) string {
	if g.URLTemplate == "" {
		return ""
	}
	return strings.Replace(g.URLTemplate, "{port}", strconv.Itoa(port), 1)
}

// MarshalJSON sends egress only when set, keeping an empty list (no outbound traffic) apart from none.
func (r CreateRequest) MarshalJSON() ([]byte, error) {
	type plain CreateRequest
	if r.Egress == nil {
		return json.Marshal(plain(r))
	}
	return json.Marshal(struct {
		plain
		Egress []string `json:"egress"`
	}{plain(r), r.Egress})
}

// ListOptions filters List. Every metadata pair must match.
type ListOptions struct {
	Status   string
	Metadata map[string]string
}

// RunCodeRequest is the body of POST /v1/sandboxes/{id}/run_code.
type RunCodeRequest struct {
	Code string `json:"code"`
	// Env is set in the interpreter's os.environ for this call only (restored after it).
	Env map[string]string `json:"env,omitempty"`
	// TimeoutS limits the run: nil = server default (300 s), 0 = no limit.
	TimeoutS *int `json:"timeout_s,omitempty"`
}

// ExecError is a Python exception raised by run_code.
type ExecError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

func (e *ExecError) Error() string {
	if e.Value == "" {
		return e.Name
	}
	return e.Name + ": " + e.Value
}

// Execution is the result of run_code.
type Execution struct {
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Value is repr() of a trailing expression, or nil.
	Value *string `json:"value"`
	// Error is the exception, or nil on success.
	Error          *ExecError `json:"error"`
	ExecutionCount int        `json:"execution_count"`
	// Results are the cell's rich results in order, as a Jupyter kernel gives them: an "execute_result" for the
	// trailing expression, a "display_data" for each display(), plt.show() or figure left open.
	Results []Result `json:"results"`
	// Interrupted is true when Interrupt stopped the call (Error is then a KeyboardInterrupt).
	Interrupted bool `json:"interrupted,omitempty"`
}

// Interrupted counts the calls an Interrupt stopped.
type Interrupted struct {
	RunCode int `json:"run_code"`
	Exec    int `json:"exec"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec. Set Cmd (run by /bin/sh -c) or Argv.
type ExecRequest struct {
	Cmd  string            `json:"cmd,omitempty"`
	Argv []string          `json:"argv,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	// TimeoutS limits the command: nil = server default (300 s), 0 = no limit.
	TimeoutS *int   `json:"timeout_s,omitempty"`
	Stdin    string `json:"stdin,omitempty"`
}

// ExecResult is the result of exec. In streamed calls Stdout and Stderr are empty: the output went to the
// event callback.
type ExecResult struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	TimedOut bool   `json:"timed_out"`
	// Interrupted is true when Interrupt stopped the command.
	Interrupted bool `json:"interrupted"`
}

// Event is one output event of a streamed run_code or exec: Type is "stdout" or "stderr" and Data the text.
// Unknown event types are passed through with their raw line in Raw.
type Event struct {
	Type string `json:"type"`
	Data string `json:"data"` // stdout and stderr
	// Result is a display_data event's result (run_code), nil for other events.
	Result *Result `json:"-"`
	Raw    []byte  `json:"-"`
}

// Result is one rich result of run_code: Type is "execute_result" or "display_data"; Data maps mime types
// ("text/plain", always present; "image/png", base64; "text/html"; "application/json"; ...) to their values.
type Result struct {
	Type string                     `json:"type"`
	Data map[string]json.RawMessage `json:"data"`
}

// Text returns the value of a text format (default "text/plain"), "" if the result has none.
func (r Result) Text(mime ...string) string {
	m := "text/plain"
	if len(mime) > 0 {
		m = mime[0]
	}
	var s string
	if json.Unmarshal(r.Data[m], &s) != nil {
		return ""
	}
	return s
}

// PNG returns the decoded image/png, nil if the result has none.
func (r Result) PNG() []byte {
	b, err := base64.StdEncoding.DecodeString(r.Text("image/png"))
	if err != nil || len(b) == 0 {
		return nil
	}
	return b
}

// Entry describes a file in a sandbox.
type Entry struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// Type is "file", "dir", "symlink" or "other".
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode is the octal permission string, e.g. "0644".
	Mode       string    `json:"mode"`
	Mtime      time.Time `json:"mtime"`
	LinkTarget string    `json:"link_target,omitempty"`
}

// IsDir reports whether the entry is a directory.
func (e *Entry) IsDir() bool { return e.Type == "dir" }

// Diff is the file-system difference between two sandboxes a and b: Added are files only in b, Removed files
// only in a, Modified files in both whose contents differ. Paths are sorted.
type Diff struct {
	Added    []string `json:"added"`
	Removed  []string `json:"removed"`
	Modified []string `json:"modified"`
	// Truncated: the comparison stopped early, as a list reached the server's cap (10,000 paths) or the file
	// content it read reached its bound (4 GiB): the lists hold the differences of the paths before where it
	// stopped. Narrow the comparison with paths.
	Truncated bool `json:"truncated,omitempty"`
}

// Empty reports whether the two sandboxes had no differences.
func (d *Diff) Empty() bool { return len(d.Added)+len(d.Removed)+len(d.Modified) == 0 }

// HealthStatus is the answer of GET /healthz.
type HealthStatus struct {
	Status  string `json:"status"`
	Version string `json:"version"`
}
