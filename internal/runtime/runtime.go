// Package runtime defines what the sandbox service needs from a sandbox runtime: create a sandbox from a spec,
// reach its agent and its root file system, fork it, destroy it, and re-attach to it after a server restart.
// The Linux-namespaces runtime (package runtime/namespaces) implements it today; a microVM runtime for hosts with
// KVM is the planned second implementation.
package runtime

import (
	"context"
	"net"
	"time"

	"github.com/ramify-dev/ramify/internal/agent"
)

// RestoreSlack is what a layer restored from a snapshot may hold beyond its disk quota while it is written, so
// that a layer paused at its quota always resumes. A pause stores no more file data than the quota (a layer of
// reflinked copies is refused), and the same files written afresh are counted about as much as the originals,
// usually less (whole extents, no copy-on-write leftovers; holes stay holes: measured, a 64 MiB layer of 4000
// small files and a file filling the rest came back 416 KiB smaller); but the tree blocks of their metadata are
// laid out anew and need not come out fewer. Once the overlay is mounted the exact quota applies again.
const RestoreSlack = 8 << 20

// Spec is what a new sandbox is made from.
type Spec struct {
	ID       string
	Hostname string
	IP       net.IP
	VCPU     float64
	MemMiB   int
	MaxProcs int
	DiskMiB  int // cap on the sandbox's writable layer (0: none) where the layer driver enforces one
	Env      map[string]string
	Cwd      string
	// Egress is the sandbox's outbound allowlist (network.ParseEgress): nil is the server's default policy,
	// empty means no outbound traffic.
	Egress []string
	// Image names the read-only image under the sandbox ("" is the default image). A fork child always gets
	// its parent's.
	Image string
	// Populate, when set, fills the new sandbox's writable layer (its overlay upper directory, on the host)
	// before anything runs in it: a resume from a snapshot. It writes under the layer's cap (DiskMiB plus
	// RestoreSlack and PopulateExtra): what does not fit fails it with EDQUOT, and the create with it.
	Populate func(upperDir string) error
	// PopulateExtra is what Populate may write beyond the cap that is removed before the sandbox's own code
	// runs (an older snapshot's session files, unpacked into the layer for the interpreter to load).
	PopulateExtra int64
	// Preload lists packages the sandbox's interpreter imports as soon as it runs (a resume's session, whose
	// loading needs them): the runtime may give it an interpreter that imported them ahead, when that makes no
	// difference to what the sandbox sees.
	Preload []string
}

// DefaultInterpreterStall is how long, by default, a pause or a fork waits for a sandbox's interpreter to answer
// (a pause: for its session's next bytes) before it fails: code in the sandbox can keep the interpreter from ever
// answering (a thread that holds the GIL in C code).
const DefaultInterpreterStall = 60 * time.Second

// StuckGrace is how long an interpreter that a pause or fork gave up on (after the stall bound) may still take
// to answer before its agent replaces it (agent.Client.ReplaceStuck): a live one answers at once, its save's
// stream being closed by then.
const StuckGrace = 5 * time.Second

// Handle is the durable description of a running sandbox, saved by the service so that a restarted server can
// find the sandbox again.
type Handle struct {
	ID         string `json:"id"`
	FamilyID   string `json:"family_id"`
	AgentPid   int    `json:"agent_pid"`   // host pid of the sandbox's agent
	AgentStart uint64 `json:"agent_start"` // its start time (clock ticks since boot), to detect pid reuse
	InitPid    int    `json:"init_pid"`    // host pid of the family's init
	InitStart  uint64 `json:"init_start"`
	AgentNsPid int    `json:"agent_ns_pid"`    // the agent's pid inside the family's PID namespace
	Image      string `json:"image,omitempty"` // the image under the sandbox ("": the default)

	// The sandbox's resources are named after the id it was created with; after a merge the surviving id
	// drives resources named after the winner. Empty means ID.
	LayerID string `json:"layer_id,omitempty"`
	Cgroup  string `json:"cgroup,omitempty"`
	Veth    string `json:"veth,omitempty"`
}

// Layer is the id of the sandbox's writable layer.
func (h Handle) Layer() string {
	if h.LayerID != "" {
		return h.LayerID
	}
	return h.ID
}

// CgroupName is the name of the sandbox's cgroup.
func (h Handle) CgroupName() string {
	if h.Cgroup != "" {
		return h.Cgroup
	}
	return h.ID
}

// Runtime runs sandboxes.
type Runtime interface {
	// Create starts a new sandbox in a new family.
	Create(ctx context.Context, spec Spec) (Handle, error)
	// Destroy kills every process of the sandbox and removes its file system, cgroup and network.
	Destroy(ctx context.Context, h Handle) error
	// Recover re-attaches to a sandbox that was running before a restart; an error means it is gone.
	Recover(ctx context.Context, h Handle) error
	// Agent is the client of the sandbox's agent.
	Agent(id string) (*agent.Client, error)
	// RootPath is a host path through which the sandbox's root file system can be reached.
	RootPath(h Handle) string
	// Configure gives a running sandbox (a pre-started, warm one being claimed) new limits, env and cwd.
	Configure(ctx context.Context, h Handle, spec Spec) error
	// Usage reports resource use.
	Usage(h Handle) (Usage, error)
	// Close releases the runtime's own resources; sandboxes keep running.
	Close() error
}

// EgressSetter is implemented by runtimes that can change a running sandbox's egress policy (Spec.Egress); the
// service uses it to hand the policy back to the runtime after a server restart.
type EgressSetter interface {
	SetEgress(ctx context.Context, h Handle, egress []string) error
}

// Usage is a sandbox's current resource use.
type Usage struct {
	MemoryBytes uint64
	Pids        uint64
	OOMKills    uint64
	CPUNanos    uint64 // CPU time used since the sandbox started (for a fork child: since the fork)
	// DiskBytes is what the sandbox's file system counts against its disk limit (bytes it refers to: its own
	// writes and what it shares with its fork family), and DiskLimitBytes the limit; both -1 when the layer
	// driver does not account per sandbox (the copy driver, or btrfs without quotas).
	DiskBytes, DiskLimitBytes int64
}

// LogLine is one line a sandbox's agent, or its fork family's init, wrote to its standard error.
type LogLine struct {
	Time time.Time `json:"time"`
	// Source is "agent" (this sandbox's agent) or "family" (the family's init or an agent not yet claimed).
	Source string `json:"source"`
	Text   string `json:"text"`
}

// LogKeeper is a runtime that keeps each sandbox's recent log lines, found by the sandbox's hostname (which
// follows its agent through a merge) and its family.
type LogKeeper interface {
	Logs(hostname, family string) []LogLine
}

// ForkResult describes a completed fork.
type ForkResult struct {
	Children    []Handle
	PauseWindow time.Duration // how long the parent was frozen
	Total       time.Duration
}

// Forker is implemented by runtimes that can branch a running sandbox and commit a branch back.
type Forker interface {
	// Fork makes len(children) new sandboxes, each starting from parent's state at one instant.
	Fork(ctx context.Context, parent Handle, children []Spec) (ForkResult, error)
	// Swap makes parent's id drive winner's processes, file system and network from now on; the parent's old
	// state is destroyed and winner's id is no longer known to the runtime. It returns the parent's new handle.
	Swap(ctx context.Context, parent, winner Handle) (Handle, error)
	// Rekeyed is the handle Swap(parent, winner) returns, known before it runs: the service records it first,
	// so that a server killed around the swap restarts with the merge done (Recover takes it).
	Rekeyed(parent, winner Handle) Handle
	// UpperDir is the host directory holding the sandbox's writable layer's changes (overlay upper dir).
	UpperDir(h Handle) string
	// Freeze stops every process of the sandbox until Thaw (for a consistent copy of its layer).
	Freeze(ctx context.Context, h Handle) error
	// Thaw resumes the sandbox's processes.
	Thaw(ctx context.Context, h Handle) error
	// LowerDirs are the host directories of the read-only image under the sandbox, top first (the overlay's
	// lower dirs: a named image's own layer above the default image).
	LowerDirs(h Handle) ([]string, error)
}

// Stiller is implemented by runtimes that can tell whether a running sandbox did anything of its own accord
// between two moments: what lets the service make a fork's children ahead of the call and know, when it comes,
// that they still start from the parent's state (ahead.go in the sandbox service).
type Stiller interface {
	// Stillness fingerprints what could change h's interpreter or files without a call through the runtime.
	Stillness(ctx context.Context, h Handle) (Stillness, error)
	// Intact reports (nil) that h's agent, family init and interpreter all still run: a child made ahead is
	// handed to a fork only then (killed from the host, its interpreter would answer InterpreterDied, its agent
	// not at all).
	Intact(h Handle) error
}

// Stillness is a running sandbox's fingerprint (Stiller). Two equal marks taken at two moments mean that no
// process of the sandbox but its agent ran in between, and that it has the same processes.
type Stillness struct {
	Mark string
	// Busy is set when the sandbox runs processes besides its agent and its interpreter (a background job, a
	// server, an SSH session): whatever they do moves the mark, so children made ahead would not be used.
	Busy bool
}

// ForkPreparer is implemented by runtimes that can make a sandbox's first fork cheaper ahead of it.
type ForkPreparer interface {
	// PrepareFork readies h's family for a fork, in the background, for children with limits' cgroup limits
	// (VCPU, MemMiB, MaxProcs); cheap and idempotent, called as the sandbox's interpreter runs code.
	PrepareFork(h Handle, limits Spec)
}

// SaveCopier is implemented by runtimes that give the copy a sandbox's interpreter forks to save its session (a
// pause, a template) a memory budget of its own, outside the sandbox's: a save that needs more memory than the
// sandbox has left (the pickler's memo, the pages of the session the copy touches) then fails alone, and the
// interpreter whose session it saves runs on untouched.
type SaveCopier interface {
	// SaveBudget makes the cgroup for h's save copy, with limits for a sandbox of spec (VCPU) and
	// SaveCopyMemory(spec.MemMiB) of memory, ahead of the copy. adopt moves the copy (pid, numbered in the
	// family's PID namespace; it must be one of h's processes) into it. end, which must be called, kills
	// whatever is left there, removes the cgroup and reports whether the kernel killed a process in it for want
	// of memory, and how much memory charged there outlived the copy (kept): pages the copy wrote into something
	// h's other processes hold (a memfd or a tmpfs file made before the save, a System V segment), which h's own
	// limit does not count. Only h's code can do that (its objects' __reduce__ run in the copy); such memory
	// goes only with h's processes and namespaces, so the caller restarts them (Healer.Revive) when kept passes
	// SaveKeptSlack.
	SaveBudget(h Handle, spec Spec) (adopt func(pid int) error, end func() (oomKilled bool, kept int64), err error)
}

// SaveKeptSlack is the memory a save copy's cgroup may still hold once the copy is gone and the page cache is
// reclaimed (kernel objects not yet freed) before the sandbox is taken to keep the save's memory (SaveCopier).
const SaveKeptSlack = 8 << 20

// SaveCopyMemory is the memory a save copy of a sandbox with memMiB of memory may use (SaveCopier): twice the
// sandbox's, enough for a copy of every page of its session and the pickler's memo.
func SaveCopyMemory(memMiB int) int64 { return 2 * int64(memMiB) << 20 }

// ResumePreparer is implemented by runtimes that can make a resume (or a create from a template) cheaper ahead
// of it.
type ResumePreparer interface {
	// PrepareResume readies, in the background, for sandboxes whose session's loading imports preload
	// (Spec.Preload); cheap and idempotent, called as such a session is saved.
	PrepareResume(preload []string)
}

// Lost is a sandbox whose own machinery (its agent, or its family's init) died: it cannot answer.
type Lost struct {
	Handle Handle
	Reason string
}

// Healer is implemented by runtimes that notice when a sandbox's machinery dies under it (killed from the host,
// out of memory, a bug) and can bring the sandbox back.
type Healer interface {
	// Lost lists the running sandboxes whose agent or family init is gone. It is cheap: the service polls it.
	Lost() []Lost
	// Revive starts a lost sandbox afresh on its own file system: whatever is left of its processes is killed,
	// and a new agent and interpreter start with spec's limits, env, cwd and address. Files are kept; the
	// interpreter's variables are not. It returns the sandbox's new handle.
	Revive(ctx context.Context, h Handle, spec Spec) (Handle, error)
}

// Owned is what a server's records account for at start-up, after recovery: everything else of this server's
// that a runtime finds is left over from work a crash cut short.
type Owned struct {
	// Running are the handles of the running sandboxes: their family init, agent, cgroup, veth and layer.
	Running []Handle
	// Layers are further layers to keep (sandboxes in error keep their files until they are deleted).
	Layers []string
}

// Reclaimed counts what a Reclaim removed, by kind.
type Reclaimed struct {
	Processes int // family inits (their whole PID namespace dies with them) and stray agents
	Cgroups   int
	Veths     int // host veths and their nftables elements
	Layers    int
	// KeptSaves: the running sandboxes (by id) whose save copy's cgroup, left by a server killed during a pause
	// or a template's capture, still held more than SaveKeptSlack once emptied, and how much: memory the
	// sandbox's processes keep outside its limit, which goes only with them (SaveCopier). The caller restarts
	// their processes (Healer.Revive).
	KeptSaves map[string]int64
}

// Reclaimer is implemented by runtimes that can find, at start-up, the resources of this server (and only of
// this server: its data directory's) that no record owns, and remove them. It must be safe to run again.
type Reclaimer interface {
	Reclaim(ctx context.Context, owned Owned) (Reclaimed, error)
}
