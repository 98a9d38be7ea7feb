package namespaces

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ramify-dev/ramify/internal/cgroups"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/runtime"
)

var _ runtime.SaveCopier = (*Runtime)(nil)

// saveCopyTasks is the tasks limit of a save copy's cgroup: the copy itself, and what code it runs as it saves
// (an object's __reduce__) may start.
const saveCopyTasks = 64

// saveCgroupName is the cgroup of the save copy of the sandbox whose cgroup is named cg. A server killed during
// a save leaves it behind; the reclaim scan at the next start removes it (no record names it).
func saveCgroupName(cg string) string { return cg + "-save" }

// AdoptSaveCopy implements runtime.SaveCopier. The copy's pages stay charged to the sandbox's memory cgroup for
// what it shares with the interpreter (a v1 move does not carry charges along); what it copies on write and
// allocates as it saves is charged to its own.
func (r *Runtime) AdoptSaveCopy(h runtime.Handle, pid int, spec runtime.Spec) (func() bool, error) {
	sb, err := r.running(h.ID)
	if err != nil {
		return nil, err
	}
	// Only a process of this sandbox: the pid comes from inside it.
	procs, err := sb.cg.Procs()
	if err != nil {
		return nil, fmt.Errorf("adopt save copy of %s: %w", h.ID, err)
	}
	hostPid := 0
	for _, p := range procs {
		if nsPidOf(p) == pid {
			hostPid = p
			break
		}
	}
	if hostPid == 0 {
		return nil, fmt.Errorf("adopt save copy of %s: %w", h.ID, errdefs.New(errdefs.ErrNotFound,
			fmt.Sprintf("no process %d in the sandbox", pid)))
	}
	l := limitsOf(spec)
	l.MemoryBytes, l.Pids = runtime.SaveCopyMemory(spec.MemMiB), saveCopyTasks
	name := saveCgroupName(sb.cg.Name())
	cg, err := r.cfg.Cgroups.Create(name, l)
	if errors.Is(err, errdefs.ErrConflict) { // left by an earlier save cut short
		if old, lerr := r.cfg.Cgroups.Load(name); lerr == nil {
			removeCgroup(old)
		}
		cg, err = r.cfg.Cgroups.Create(name, l)
	}
	if err != nil {
		return nil, fmt.Errorf("adopt save copy of %s: %w", h.ID, err)
	}
	if err := cg.Add(hostPid); err != nil {
		removeCgroup(cg)
		return nil, fmt.Errorf("adopt save copy of %s: %w", h.ID, err)
	}
	return func() bool {
		st, _ := cg.Stats()
		removeCgroup(cg)
		return st.OOMKills > 0
	}, nil
}

// removeCgroup kills what is left in cg and removes it.
func removeCgroup(cg cgroups.Cgroup) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cg.Kill(ctx) //nolint:errcheck // Delete says if anything is left
	cg.Delete()  //nolint:errcheck // the reclaim scan at the next start removes what is left
}
