// Package cgroups owns per-sandbox resource control: one cgroup per sandbox, named <parent>/<name>, on cgroup v1
// (in each of the memory, cpu, cpuacct, pids and freezer hierarchies) or cgroup v2 (one directory in the unified
// hierarchy). It applies CPU, memory and pid limits, moves processes in, freezes and thaws them, kills everything
// inside, reports usage and OOM kills, and removes the cgroups. Detection of the host's cgroup mode uses
// github.com/containerd/cgroups/v3; everything else is plain reads and writes of cgroupfs files (the library's
// cgroup1/cgroup2 packages pull in dependencies this module does not carry).
package cgroups

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	cgroupsv3 "github.com/containerd/cgroups/v3"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"golang.org/x/sys/unix"
)

// DefaultMount is where the host's cgroup file systems are mounted.
const DefaultMount = "/sys/fs/cgroup"

// CPUPeriod is the CFS period, in microseconds, that CPU quotas are expressed against (100ms).
const CPUPeriod = 100000

// Limits are a cgroup's resource limits. A zero field means unlimited.
type Limits struct {
	// CPUs is the number of CPUs' worth of time per period (quota = CPUs × 100ms). 0 = unlimited.
	CPUs float64
	// MemoryBytes caps memory (and, where the kernel accounts it, memory+swap) usage. 0 = unlimited.
	MemoryBytes int64
	// Pids caps the number of tasks (processes and threads). 0 = unlimited.
	Pids int64
}

// Stats is a snapshot of a cgroup's usage.
type Stats struct {
	// MemoryBytes is the current memory usage (v1 memory.usage_in_bytes, v2 memory.current).
	MemoryBytes uint64
	// Pids is the current number of tasks (pids.current).
	Pids uint64
	// OOMKills is how many processes the OOM killer killed in the cgroup (oom_kill in v1 memory.oom_control,
	// v2 memory.events).
	OOMKills uint64
	// CPUNanos is the CPU time the cgroup's tasks used, in nanoseconds (v1 cpuacct.usage, v2 cpu.stat usage_usec).
	CPUNanos uint64
}

// Manager creates and finds the cgroups under one parent.
type Manager interface {
	// Version is 1 or 2.
	Version() int
	// Create makes the cgroup name with limits l. An existing cgroup of that name is errdefs.ErrConflict.
	Create(name string, l Limits) (Cgroup, error)
	// Load returns the existing cgroup name, or an error matching errdefs.ErrNotFound.
	Load(name string) (Cgroup, error)
	// List returns the names of the cgroups under the parent, sorted.
	List() ([]string, error)
}

// Renamer is a Manager that can rename a cgroup in place, processes and usage included (cgroup v1; cgroup v2
// has no rename). A rename costs no move: moving a process into a v1 cgroup waits for an RCU grace period per
// hierarchy (~8 ms for five after a pause), which a process placed in a cgroup ahead of need avoids.
type Renamer interface {
	// Rename gives cgroup old the name new (which must not exist) and returns it.
	Rename(old, new string) (Cgroup, error)
}

// ParentRemover is a Manager that can remove the parent directories it created: a server whose start-up fails
// leaves nothing behind (a server that started keeps its parent for its sandboxes and its next start).
type ParentRemover interface {
	// RemoveCreatedParent removes, deepest first, the parent directories that this Manager's creation made in
	// each hierarchy. A directory that is gone is not an error; one that holds cgroups or processes is left.
	RemoveCreatedParent() error
}

// Releaser is a Manager that holds something on the host for as long as it lives (v1: a frozen keeper cgroup in
// its parent, see keepFreezerActive), which Release gives back; the server calls it as it stops. Idempotent.
type Releaser interface {
	Release() error
}

// missingDirs lists dir and its ancestors below root that do not exist, deepest first: what MkdirAll(dir) makes.
func missingDirs(root, dir string) []string {
	var out []string
	for d := dir; d != root && len(d) > len(root); d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		out = append(out, d)
	}
	return out
}

// removeDirs removes each of dirs (cgroup directories: rmdir), tolerating those already gone.
func removeDirs(dirs []string) error {
	var errs []error
	for _, d := range dirs {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// MemoryCreator is implemented by managers that can make a cgroup in the memory hierarchy alone (v1): moving a
// process there is one migration instead of one per hierarchy (each can wait out an RCU grace period, up to
// ~25 ms after a quiet spell), and the process keeps its CPU, tasks and freezer cgroups.
type MemoryCreator interface {
	CreateMemory(name string, memoryBytes int64) (Cgroup, error)
}

// MemoryKeeper is implemented by cgroups that can report the memory still charged to them once no process is
// left in them: memory a process of the cgroup allocated that outlives it, held by processes elsewhere (a memfd,
// a file on a tmpfs, a System V segment). KeptMemory reclaims what the kernel can (the page cache) first, so
// what it reports is what only its holders can give back. A cgroup with processes in it reports an error.
type MemoryKeeper interface {
	KeptMemory() (int64, error)
}

// MoveWarmer is a Manager whose moves can be kept fast while moves are coming. Moving a process (Add) takes the
// kernel's cgroup thread-group lock for writing, and the first writer after the lock has gone unused for a
// while waits for an RCU grace period (~8 ms here, the same for one hierarchy or five); a hierarchy mounted with
// favordynmods skips it, but a v1 hierarchy's options cannot change once it is mounted. While kept warm, a
// writer comes often enough that the lock never goes back to its idle state, and a move takes ~0.4 ms.
type MoveWarmer interface {
	// KeepMovesFast keeps moves fast until the returned function is called. Calls may overlap; the first
	// moves after a call may still wait for the grace period the warming itself started.
	KeepMovesFast() (done func())
}

// Cgroup is one sandbox's cgroup. Its methods are safe for concurrent use, though concurrent Freeze/Thaw/Kill on
// the same cgroup make little sense.
type Cgroup interface {
	// Name is the cgroup's name under the parent.
	Name() string
	// Add moves process pid, with all its threads, into the cgroup.
	Add(pid int) error
	// Procs returns the pids of the processes in the cgroup, sorted.
	Procs() ([]int, error)
	// Freeze stops every process in the cgroup and returns once the kernel reports the cgroup frozen. If ctx ends
	// first, it thaws the cgroup again and returns ctx's error.
	Freeze(ctx context.Context) error
	// Thaw resumes a frozen cgroup and returns once the kernel reports it thawed.
	Thaw(ctx context.Context) error
	// Kill sends SIGKILL to every process in the cgroup, including ones forked meanwhile, and returns once the
	// cgroup is empty (or ctx ends).
	Kill(ctx context.Context) error
	// Delete removes the cgroup's directories. A cgroup that does not exist is not an error; one that still has
	// processes is errdefs.ErrConflict.
	Delete() error
	// Stats reports current usage and the OOM kill count.
	Stats() (Stats, error)
	// Update applies new limits to a live cgroup.
	Update(l Limits) error
	// TasksLimit reads the tasks limit (Limits.Pids; 0 = unlimited).
	TasksLimit() (int64, error)
	// SetTasksLimit sets the tasks limit (Limits.Pids; 0 = unlimited) alone, leaving the others as they are.
	SetTasksLimit(n int64) error
}

// tasksLimit is the value of pids.max for a Limits.Pids of n.
func tasksLimit(n int64) string {
	if n > 0 {
		return strconv.FormatInt(n, 10)
	}
	return "max"
}

// readTasksLimit reads pids.max at path as a Limits.Pids.
func readTasksLimit(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v := strings.TrimSpace(string(b))
	if v == "max" {
		return 0, nil
	}
	return strconv.ParseInt(v, 10, 64)
}

// Detect returns a v2 Manager when /sys/fs/cgroup is a cgroup2 mount with controllers available, else a v1
// Manager. parent is the path of ramify's parent cgroup below each hierarchy's root, e.g. "ramify".
func Detect(parent string, log *slog.Logger) (Manager, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "cgroups")
	mode := cgroupsv3.Mode()
	if mode == cgroupsv3.Unified {
		ctrls, err := os.ReadFile(filepath.Join(DefaultMount, "cgroup.controllers"))
		if err == nil && len(bytes.TrimSpace(ctrls)) > 0 {
			log.Debug("using cgroup v2", "controllers", strings.TrimSpace(string(ctrls)))
			return newV2(DefaultMount, parent, log)
		}
		log.Warn("cgroup v2 mounted without controllers; trying v1")
	}
	log.Debug("using cgroup v1", "mode", mode)
	return newV1(DefaultMount, parent, log)
}

// cleanParent validates a parent path: non-empty, relative elements that are each valid names.
func cleanParent(parent string) (string, error) {
	p := strings.Trim(filepath.Clean("/"+parent), "/")
	if p == "" {
		return "", errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("invalid cgroup parent %q", parent))
	}
	for _, el := range strings.Split(p, "/") {
		if validName(el) != nil {
			return "", errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("invalid cgroup parent %q", parent))
		}
	}
	return p, nil
}

// validName checks a cgroup name: 1-255 characters of [A-Za-z0-9_.-], not starting with '.'.
func validName(name string) error {
	bad := name == "" || len(name) > 255 || name[0] == '.'
	for i := 0; !bad && i < len(name); i++ {
		c := name[i]
		bad = !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-')
	}
	if bad {
		return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("invalid cgroup name %q", name))
	}
	return nil
}

func validLimits(l Limits) error {
	if l.CPUs < 0 || math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0) || l.CPUs > 1<<20 {
		return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("invalid cpu limit %v", l.CPUs))
	}
	if l.MemoryBytes < 0 {
		return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("invalid memory limit %d", l.MemoryBytes))
	}
	if l.Pids < 0 {
		return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("invalid pids limit %d", l.Pids))
	}
	return nil
}

// cpuQuota is the CFS quota in microseconds for l.CPUs, or -1 for unlimited. The kernel's minimum is 1ms.
func cpuQuota(cpus float64) int64 {
	if cpus == 0 {
		return -1
	}
	q := int64(math.Round(cpus * CPUPeriod))
	return max(q, 1000)
}

// writeFile writes s to an existing cgroupfs file (cgroupfs files cannot be created).
func writeFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", s, path, err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// readProcs parses a cgroup.procs file.
func readProcs(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids, nil
}

func addPid(dir string, pid int) error {
	if pid <= 0 {
		return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("invalid pid %d", pid))
	}
	err := writeFile(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid))
	if errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("pid %d: %w", pid, errdefs.ErrNotFound)
	}
	return err
}

// readUint reads a file holding a single unsigned number. "max" reads as math.MaxUint64.
func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return math.MaxUint64, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return v, nil
}

// readKey returns the value of "key value" line key in a flat-keyed file such as memory.events, memory.stat or
// memory.oom_control.
func readKey(path, key string) (uint64, bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, false, fmt.Errorf("parse %s %s: %w", path, key, err)
			}
			return n, true, nil
		}
	}
	return 0, false, nil
}

// poll calls done until it reports true, with a short backoff, or until ctx ends.
func poll(ctx context.Context, done func() (bool, error)) error {
	delay := time.Millisecond
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(delay*2, 20*time.Millisecond)
	}
}

// killPids sends SIGKILL to each pid; processes that are already gone are skipped.
func killPids(pids []int) error {
	var errs []error
	for _, pid := range pids {
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("kill %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}

// rmdir removes one cgroup directory. Missing is fine. EBUSY with processes listed in the cgroup is
// errdefs.ErrConflict at once; EBUSY without (processes still exiting, or the kernel still tearing the cgroup
// down) is retried for up to two seconds first.
func rmdir(dir string) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Rmdir(dir)
		switch {
		case err == nil, errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EBUSY) && time.Now().Before(deadline) && !hasProcs(dir):
			time.Sleep(10 * time.Millisecond)
		case errors.Is(err, unix.EBUSY):
			return fmt.Errorf("remove %s: %w", dir, errdefs.New(errdefs.ErrConflict, "cgroup is not empty"))
		default:
			return fmt.Errorf("remove %s: %w", dir, &os.PathError{Op: "rmdir", Path: dir, Err: err})
		}
	}
}

func hasProcs(dir string) bool {
	pids, err := readProcs(filepath.Join(dir, "cgroup.procs"))
	return err == nil && len(pids) > 0
}

// mkdir creates dir (its parents must exist); it reports whether it created it.
func mkdir(dir string) (bool, error) {
	err := os.Mkdir(dir, 0o755)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, syscall.EEXIST) {
		return false, nil
	}
	return false, err
}

// listDirs returns the valid cgroup names that are subdirectories of dir.
func listDirs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() && validName(e.Name()) == nil {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}
