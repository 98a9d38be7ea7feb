package namespaces

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/runtime"
)

var _ runtime.Reclaimer = (*Runtime)(nil)

// initArgs is a family init's command line: the owner tag lets a restarted server tell its own orphaned inits
// from other servers' (and from inits started before inits were tagged, which it leaves alone).
func initArgs(owner string) []string {
	if owner == "" {
		return []string{"__init"}
	}
	return []string{"__init", "--owner=" + owner}
}

// Reclaim implements runtime.Reclaimer. It removes, in this order, what no running sandbox (and, for layers,
// no record) owns: family inits tagged with this server's owner (their PID namespace, agents and interpreters
// die with them) and stray agents left in the families of running sandboxes; the cgroups under this server's
// parent (killing what is in them); the host veths marked as this server's and their nftables elements; and the
// layers under this server's data directory (fork staging snapshots included). Everything it looks at is
// named per data directory, so another server's resources are never touched; running it again finds nothing.
func (r *Runtime) Reclaim(ctx context.Context, owned runtime.Owned) (runtime.Reclaimed, error) {
	var res runtime.Reclaimed
	var errs []error
	inits, agents := map[[2]uint64]bool{}, map[[2]uint64]bool{}
	cgs, veths, layers := map[string]bool{}, map[string]bool{}, map[string]bool{}
	saves := map[string]string{} // a running sandbox's save copy's cgroup name: the sandbox's id
	for _, h := range owned.Running {
		inits[[2]uint64{uint64(h.InitPid), h.InitStart}] = true
		agents[[2]uint64{uint64(h.AgentPid), h.AgentStart}] = true
		cgs[h.CgroupName()], cgs[h.FamilyID], veths[vethOf(h)], layers[h.Layer()] = true, true, true, true
		saves[saveCgroupName(h.CgroupName())] = h.ID
	}
	for _, l := range owned.Layers {
		layers[l] = true
	}
	res.Processes = r.killOrphanProcesses(inits, agents)
	n, kept, err := r.reclaimCgroups(ctx, cgs, saves)
	res.Cgroups, res.KeptSaves = n, kept
	errs = append(errs, err)
	if r.cfg.Network != nil {
		n, err := r.cfg.Network.Reclaim(func(v string) bool { return veths[v] })
		res.Veths = n
		errs = append(errs, err)
	}
	n, err = r.reclaimLayers(ctx, layers)
	res.Layers = n
	errs = append(errs, err)
	r.startPrestartUpkeep() // after the scan, which would take families started ahead for orphans
	return res, errors.Join(errs...)
}

// killOrphanProcesses SIGKILLs this server's family inits that no running sandbox names, and the agents that
// running sandboxes' inits started but no running sandbox names (a crash between spawning an agent and
// recording it); idle spare agents belong to their family and are kept. It returns how many it killed.
func (r *Runtime) killOrphanProcesses(inits, agents map[[2]uint64]bool) int {
	if r.cfg.Owner == "" {
		return 0
	}
	want := strings.Join(append([]string{"ramify"}, initArgs(r.cfg.Owner)...), "\x00") + "\x00"
	killed := 0
	var liveInits []int
	for _, pid := range allPids() {
		cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil || string(cmd) != want || nsPidOf(pid) != 1 {
			continue
		}
		start, err := procStart(pid)
		if err != nil {
			continue
		}
		if inits[[2]uint64{uint64(pid), start}] {
			liveInits = append(liveInits, pid)
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	for _, ip := range liveInits {
		for _, pid := range childPids("/proc/" + strconv.Itoa(ip)) {
			start, err := procStart(pid)
			if err != nil || agents[[2]uint64{uint64(pid), start}] {
				continue
			}
			cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			args := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
			if len(args) < 2 || args[1] != "__agent" || (len(args) > 2 && args[2] == agent.SpareArg) {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
	}
	return killed
}

// allPids lists the host's processes.
func allPids() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// reclaimCgroups kills the processes in, and removes, every cgroup under this server's parent that keep does
// not name. A running sandbox's save copy's cgroup (saves: its name to the sandbox's id), left by a server killed
// during a save, may still hold memory once emptied that the sandbox's own processes keep (what the copy wrote
// into a memfd or /dev/shm as it saved): removed, that memory would count against nothing. Those sandboxes and
// what their processes keep are returned (removeSaveCgroup), for their processes to be restarted.
func (r *Runtime) reclaimCgroups(ctx context.Context, keep map[string]bool, saves map[string]string) (int, map[string]int64, error) {
	names, err := r.cfg.Cgroups.List()
	if err != nil {
		return 0, nil, fmt.Errorf("reclaim cgroups: %w", err)
	}
	n := 0
	var kept map[string]int64
	var errs []error
	for _, name := range names {
		if keep[name] {
			continue
		}
		if fam, _, ok := strings.Cut(name, ".s"); ok && keep[fam] {
			continue // a running family's spare (placeSpares)
		}
		cg, err := r.cfg.Cgroups.Load(name)
		if err != nil {
			continue // gone meanwhile
		}
		if id, ok := saves[name]; ok {
			if k := removeSaveCgroup(cg); k > runtime.SaveKeptSlack {
				if kept == nil {
					kept = map[string]int64{}
				}
				kept[id] = k
			}
			n++
			continue
		}
		if err := cg.Kill(ctx); err != nil {
			errs = append(errs, fmt.Errorf("reclaim cgroup %s: %w", name, err))
			continue
		}
		if err := cg.Delete(); err != nil {
			errs = append(errs, fmt.Errorf("reclaim cgroup %s: %w", name, err))
			continue
		}
		n++
	}
	return n, kept, errors.Join(errs...)
}

// reclaimLayers removes every layer that keep does not name.
func (r *Runtime) reclaimLayers(ctx context.Context, keep map[string]bool) (int, error) {
	ids, err := r.cfg.Layers.List()
	if err != nil {
		return 0, fmt.Errorf("reclaim layers: %w", err)
	}
	n := 0
	var errs []error
	for _, id := range ids {
		if keep[id] {
			continue
		}
		if err := r.cfg.Layers.Remove(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("reclaim layer %s: %w", id, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
