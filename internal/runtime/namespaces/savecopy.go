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

// saveCopyTasks is the tasks limit of a save copy's cgroup where it cannot be a memory cgroup alone (v2): the
// copy itself, and what code it runs as it saves (an object's __reduce__) may start.
const saveCopyTasks = 64

// saveCgroupName is the cgroup of the save copy of the sandbox whose cgroup is named cg. A server killed during
// a save leaves it behind; the reclaim scan at the next start removes it (no record names it).
func saveCgroupName(cg string) string { return cg + "-save" }

// SaveBudget implements runtime.SaveCopier. The copy's pages stay charged to the sandbox's memory cgroup for
// what it shares with the interpreter (a v1 move does not carry charges along); what it copies on write and
// allocates as it saves is charged to its own. Moves are kept fast from here on (the grace period a v1 move
// waits for after a quiet spell, up to ~25 ms, passes while the interpreter forks the copy).
func (r *Runtime) SaveBudget(h runtime.Handle, spec runtime.Spec) (func(int) error, func() (bool, int64), error) {
	sb, err := r.running(h.ID)
	if err != nil {
		return nil, nil, err
	}
	warm := r.movesFast()
	name := saveCgroupName(sb.cg.Name())
	create := func() (cgroups.Cgroup, error) {
		if mc, ok := r.cfg.Cgroups.(cgroups.MemoryCreator); ok {
			// The memory hierarchy alone: the copy's CPU and tasks count as the sandbox's, as they should.
			return mc.CreateMemory(name, runtime.SaveCopyMemory(spec.MemMiB))
		}
		l := limitsOf(spec)
		l.MemoryBytes, l.Pids = runtime.SaveCopyMemory(spec.MemMiB), saveCopyTasks
		return r.cfg.Cgroups.Create(name, l)
	}
	cg, err := create()
	if errors.Is(err, errdefs.ErrConflict) { // left by an earlier save cut short
		if old, lerr := r.cfg.Cgroups.Load(name); lerr == nil {
			removeCgroup(old)
		}
		cg, err = create()
	}
	if err != nil {
		warm()
		return nil, nil, fmt.Errorf("save budget of %s: %w", h.ID, err)
	}
	adopt := func(pid int) error {
		defer warm()
		// Only a process of this sandbox: the pid comes from inside it.
		procs, err := sb.cg.Procs()
		if err != nil {
			return fmt.Errorf("adopt save copy of %s: %w", h.ID, err)
		}
		for _, p := range procs {
			if nsPidOf(p) == pid {
				if err := cg.Add(p); err != nil {
					return fmt.Errorf("adopt save copy of %s: %w", h.ID, err)
				}
				return nil
			}
		}
		return fmt.Errorf("adopt save copy of %s: %w", h.ID, errdefs.New(errdefs.ErrNotFound,
			fmt.Sprintf("no process %d in the sandbox", pid)))
	}
	end := func() (bool, int64) {
		warm()
		st, _ := cg.Stats()
		kept := removeSaveCgroup(cg)
		return st.OOMKills > 0, kept
	}
	return adopt, end, nil
}

// removeSaveCgroup kills what is left in a save copy's cgroup and removes it, and returns the memory still
// charged there with no process left in it, which only the sandbox's processes can hold (see
// runtime.SaveCopier).
func removeSaveCgroup(cg cgroups.Cgroup) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var kept int64
	if err := cg.Kill(ctx); err != nil {
		// Something outran the kill and runs on outside the sandbox's memory limit: only a restart of the
		// sandbox's processes ends it.
		st, _ := cg.Stats()
		kept = max(int64(st.MemoryBytes), runtime.SaveKeptSlack+1)
	} else if mk, ok := cg.(cgroups.MemoryKeeper); ok {
		kept, _ = mk.KeptMemory()
	}
	cg.Delete() //nolint:errcheck // the reclaim scan at the next start removes what is left
	return kept
}

// removeCgroup kills what is left in cg and removes it.
func removeCgroup(cg cgroups.Cgroup) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cg.Kill(ctx) //nolint:errcheck // Delete says if anything is left
	cg.Delete()  //nolint:errcheck // the reclaim scan at the next start removes what is left
}
