package namespaces

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/runtime"
)

var _ runtime.Stiller = (*Runtime)(nil)

// stillReads is how many times Stillness reads the sandbox's CPU time while its agent runs across the read.
const stillReads = 5

// Stillness implements runtime.Stiller. The mark is the sandbox's processes (host pids, from its cgroup) and the
// CPU time its cgroup used less its agent's: any process that ran in the sandbox, even one started and gone
// between the two marks, used CPU charged to the cgroup; the agent's own work (answering the server's calls) is
// left out. The two counters are read with the agent's read on both sides, again while the agent ran in between
// (up to stillReads times): read as it runs, they disagree, and two marks of a sandbox that did not change
// differed, so its children made ahead went unused (a server checking its agent's health as a fork came, a
// loaded host). A disagreement left after that only makes two marks differ, never agree wrongly.
func (r *Runtime) Stillness(ctx context.Context, h runtime.Handle) (runtime.Stillness, error) {
	r.mu.Lock()
	sb := r.sandboxes[h.ID]
	r.mu.Unlock()
	if sb == nil {
		return runtime.Stillness{}, errdefs.New(errdefs.ErrConflict, "sandbox is not running")
	}
	procs, err := sb.cg.Procs()
	if err != nil {
		return runtime.Stillness{}, fmt.Errorf("stillness of %s: %w", h.ID, err)
	}
	var cpu, agentNs uint64
	for range stillReads {
		before, err := taskNanos(sb.h.AgentPid)
		if err != nil {
			return runtime.Stillness{}, fmt.Errorf("stillness of %s: agent: %w", h.ID, err)
		}
		st, err := sb.cg.Stats()
		if err != nil {
			return runtime.Stillness{}, fmt.Errorf("stillness of %s: %w", h.ID, err)
		}
		cpu = st.CPUNanos
		if agentNs, err = taskNanos(sb.h.AgentPid); err != nil {
			return runtime.Stillness{}, fmt.Errorf("stillness of %s: agent: %w", h.ID, err)
		}
		if agentNs == before {
			break
		}
	}
	// Linux AIO is the one way the sandbox's memory changes without its processes running: an O_DIRECT read
	// submitted with io_submit completes into the caller's buffer (and the context's ring) later, in the kernel.
	aio := false
	for _, pid := range procs {
		if pid != sb.h.AgentPid && hasAIO(pid) {
			aio = true
		}
	}
	return runtime.Stillness{
		Mark: fmt.Sprintf("%v %d %v", procs, int64(cpu)-int64(agentNs), aio),
		Busy: len(procs) > 2 || aio, // its agent and its interpreter, with no AIO context
	}, nil
}

// Intact implements runtime.Stiller: the agent and the family init have not exited (their pidfds, as Lost
// sees them), and the sandbox's cgroup holds a process besides its agent (its interpreter: a child made ahead
// runs nothing else).
func (r *Runtime) Intact(h runtime.Handle) error {
	r.mu.Lock()
	sb := r.sandboxes[h.ID]
	var dead map[procKey]bool
	if sb != nil {
		dead, _ = r.live.check([]procKey{{sb.h.InitPid, sb.h.InitStart}, {sb.h.AgentPid, sb.h.AgentStart}})
	}
	r.mu.Unlock()
	switch {
	case sb == nil:
		return errdefs.New(errdefs.ErrConflict, "sandbox is not running")
	case dead[procKey{sb.h.InitPid, sb.h.InitStart}]:
		return errors.New("its family init died")
	case dead[procKey{sb.h.AgentPid, sb.h.AgentStart}]:
		return errors.New("its agent died")
	}
	procs, err := sb.cg.Procs()
	if err != nil {
		return fmt.Errorf("intact %s: %w", h.ID, err)
	}
	if !slices.ContainsFunc(procs, func(p int) bool { return p != sb.h.AgentPid }) {
		return errors.New("its interpreter died")
	}
	return nil
}

// hasAIO reports whether process pid has a Linux AIO context (its ring is mapped as "/[aio]"), or may have one
// (its maps cannot be read).
func hasAIO(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "maps"))
	if err != nil {
		return !os.IsNotExist(err) // gone: its exit moved the CPU time anyway
	}
	return bytes.Contains(b, []byte("/[aio]"))
}

// taskNanos is the CPU time process pid's threads used, in nanoseconds (the first field of each thread's
// /proc/<pid>/task/<tid>/schedstat).
func taskNanos(pid int) (uint64, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tids, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var sum uint64
	for _, t := range tids {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			if os.IsNotExist(err) {
				continue // a thread that ended meanwhile
			}
			return 0, err
		}
		f, _, _ := bytes.Cut(b, []byte(" "))
		n, err := strconv.ParseUint(string(f), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s/%s/schedstat: %w", dir, t.Name(), err)
		}
		sum += n
	}
	return sum, nil
}
