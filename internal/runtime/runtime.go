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

// Spec is what a new sandbox is made from.
type Spec struct {
	ID       string
	Hostname string
	IP       net.IP
	VCPU     float64
	MemMiB   int
	MaxProcs int
	Env      map[string]string
	Cwd      string
}

// Handle is the durable description of a running sandbox, saved by the service so that a restarted server can
// find the sandbox again.
type Handle struct {
	ID         string `json:"id"`
	FamilyID   string `json:"family_id"`
	AgentPid   int    `json:"agent_pid"`   // host pid of the sandbox's agent
	AgentStart uint64 `json:"agent_start"` // its start time (clock ticks since boot), to detect pid reuse
	InitPid    int    `json:"init_pid"`    // host pid of the family's init
	InitStart  uint64 `json:"init_start"`
	AgentNsPid int    `json:"agent_ns_pid"` // the agent's pid inside the family's PID namespace
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
	// Usage reports resource use.
	Usage(h Handle) (Usage, error)
	// Close releases the runtime's own resources; sandboxes keep running.
	Close() error
}

// Usage is a sandbox's current resource use.
type Usage struct {
	MemoryBytes uint64
	Pids        uint64
	OOMKills    uint64
}

// ForkResult describes a completed fork.
type ForkResult struct {
	Children    []Handle
	PauseWindow time.Duration // how long the parent was frozen
	Total       time.Duration
}

// Forker is implemented by runtimes that can branch a running sandbox.
type Forker interface {
	// Fork makes len(children) new sandboxes, each starting from parent's state at one instant.
	Fork(ctx context.Context, parent Handle, children []Spec) (ForkResult, error)
}
