package cgroups

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// v1Controllers are the hierarchies a v1 cgroup lives in. cpuset is deliberately absent: a v1 cpuset cgroup is
// unusable until cpuset.cpus and cpuset.mems are filled in.
var v1Controllers = []string{"memory", "cpu", "cpuacct", "pids", "freezer"}

type v1Manager struct {
	log    *slog.Logger
	parent string
	// ctrl maps each controller to its parent directory (<mountpoint>/<parent>). Co-mounted controllers
	// (cpu,cpuacct) share a directory.
	ctrl map[string]string
	// dirs are the distinct parent directories.
	dirs []string
	// mounts maps each controller to its hierarchy's mount point.
	mounts map[string]string
	warm   moveWarmer
	// created are the parent directories newV1 made, deepest first in each hierarchy (RemoveCreatedParent).
	created []string
	// keeper is the empty freezer cgroup kept frozen while the Manager lives ("" if none: keepFreezerActive).
	keeper string
}

// keeperName names the keeper in the freezer parent. A name validName refuses, so that List, and so reclaim, never
// see it.
const keeperName = ".frozen-keeper"

// NewV1 returns a Manager for cgroup v1 with its cgroups under parent (e.g. "ramify") in the memory, cpu,
// cpuacct, pids and freezer hierarchies, which must all be mounted. It creates the parent directories.
func NewV1(parent string) (Manager, error) {
	return newV1(DefaultMount, parent, nil)
}

func newV1(mount, parent string, log *slog.Logger) (*v1Manager, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p, err := cleanParent(parent)
	if err != nil {
		return nil, fmt.Errorf("cgroups v1: %w", err)
	}
	mounts, err := v1Mounts()
	if err != nil {
		log.Debug("reading mountinfo failed; assuming hierarchies under the default mount", "err", err)
		mounts = map[string]string{}
	}
	m := &v1Manager{log: log, parent: p, ctrl: map[string]string{}, mounts: map[string]string{}}
	seen := map[string]bool{}
	for _, c := range v1Controllers {
		mp, ok := mounts[c]
		if !ok {
			mp = filepath.Join(mount, c)
		}
		if _, err := os.Stat(filepath.Join(mp, "cgroup.procs")); err != nil {
			return nil, fmt.Errorf("cgroups v1: controller %s not mounted: %w", c, errdefs.ErrNotFound)
		}
		if real, err := filepath.EvalSymlinks(mp); err == nil {
			mp = real
		}
		dir := filepath.Join(mp, p)
		m.ctrl[c] = dir
		m.mounts[c] = mp
		if !seen[dir] {
			seen[dir] = true
			m.dirs = append(m.dirs, dir)
			m.created = append(m.created, missingDirs(mp, dir)...)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("cgroups v1: create parent %s: %w", dir, err)
			}
		}
	}
	m.keeper = m.keepFreezerActive()
	return m, nil
}

// keepFreezerActive makes an empty cgroup in the freezer hierarchy and freezes it, for as long as the Manager
// lives (Release), and returns its directory ("" if it could not). The v1 freezer turns a kernel static key on
// while any cgroup is frozen and off when none is, and each flip patches kernel text on every CPU: on a
// paravirtualized guest that cost 4.5-5 ms of CPU per freeze and as much per thaw (measured: a freeze and thaw of
// an empty cgroup, 6-7 ms of CPU a cycle, 0.06 ms with another cgroup frozen), paid on every fork (its parent is
// frozen while its layer is cloned) and every kill (freeze, kill, thaw). With one cgroup always frozen the key
// stays on; the kernel then looks up a task's freezer state in the few places that ask (try_to_freeze), as it
// does on any host with a frozen cgroup. Best effort: without it freezes work as before, only slower.
func (m *v1Manager) keepFreezerActive() string {
	dir := filepath.Join(m.ctrl["freezer"], keeperName)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		m.log.Warn("cgroups v1: cannot make the frozen keeper cgroup; freezes will be slower", "dir", dir, "err", err)
		return ""
	}
	if err := writeFile(filepath.Join(dir, "freezer.state"), "FROZEN"); err != nil {
		m.log.Warn("cgroups v1: cannot freeze the keeper cgroup; freezes will be slower", "dir", dir, "err", err)
		os.Remove(dir) //nolint:errcheck // empty
		return ""
	}
	return dir
}

// Release implements Releaser: the keeper cgroup is thawed and removed.
func (m *v1Manager) Release() error {
	if m.keeper == "" {
		return nil
	}
	writeFile(filepath.Join(m.keeper, "freezer.state"), "THAWED") //nolint:errcheck // removed either way
	err := os.Remove(m.keeper)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	m.keeper = ""
	if err != nil {
		return fmt.Errorf("cgroups v1: remove the keeper cgroup: %w", err)
	}
	return nil
}

// v1Mounts maps v1 controller names to their mount points, from /proc/self/mountinfo.
func v1Mounts() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	res := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 36 35 0:30 / /sys/fs/cgroup/memory rw,relatime shared:7 - cgroup cgroup rw,memory
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 || qf[0] != "cgroup" {
			continue
		}
		for _, opt := range strings.Split(qf[2], ",") {
			if _, dup := res[opt]; !dup {
				res[opt] = pf[4]
			}
		}
	}
	return res, sc.Err()
}

func (m *v1Manager) Version() int { return 1 }

// RemoveCreatedParent implements ParentRemover; the keeper goes first (Release), or its parent could not.
func (m *v1Manager) RemoveCreatedParent() error {
	return errors.Join(m.Release(), removeDirs(m.created))
}

func (m *v1Manager) cgroup(name string) *v1Cgroup {
	c := &v1Cgroup{name: name, ctrl: map[string]string{}}
	for ctrl, dir := range m.ctrl {
		c.ctrl[ctrl] = filepath.Join(dir, name)
	}
	for _, dir := range m.dirs {
		c.dirs = append(c.dirs, filepath.Join(dir, name))
	}
	return c
}

func (m *v1Manager) Create(name string, l Limits) (Cgroup, error) {
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	if err := validLimits(l); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	c := m.cgroup(name)
	if exists(c.ctrl["freezer"]) {
		return nil, fmt.Errorf("create cgroup %s: %w", name, errdefs.New(errdefs.ErrConflict, "cgroup already exists"))
	}
	for _, dir := range c.dirs {
		if _, err := mkdir(dir); err != nil {
			_ = c.Delete()
			return nil, fmt.Errorf("create cgroup %s: %w", name, err)
		}
	}
	if err := c.apply(l); err != nil {
		_ = c.Delete()
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	m.log.Debug("created cgroup", "name", name, "cpus", l.CPUs, "memory", l.MemoryBytes, "pids", l.Pids)
	return c, nil
}

// CreateMemory implements MemoryCreator: the cgroup is made in the memory hierarchy only, with a limit of
// memoryBytes (0: none). A process moved into it keeps its CPU, tasks and freezer cgroups.
func (m *v1Manager) CreateMemory(name string, memoryBytes int64) (Cgroup, error) {
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	if err := validLimits(Limits{MemoryBytes: memoryBytes}); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	dir := filepath.Join(m.ctrl["memory"], name)
	c := &v1Cgroup{name: name, ctrl: map[string]string{"memory": dir}, dirs: []string{dir}}
	if exists(dir) {
		return nil, fmt.Errorf("create cgroup %s: %w", name, errdefs.New(errdefs.ErrConflict, "cgroup already exists"))
	}
	if _, err := mkdir(dir); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	if err := c.applyMemory(memoryBytes); err != nil {
		_ = c.Delete()
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	m.log.Debug("created memory cgroup", "name", name, "memory", memoryBytes)
	return c, nil
}

// Rename implements Renamer: the directory is renamed in each hierarchy, and renamed back in those already done
// if one fails.
func (m *v1Manager) Rename(old, new string) (Cgroup, error) {
	for _, n := range []string{old, new} {
		if err := validName(n); err != nil {
			return nil, fmt.Errorf("rename cgroup: %w", err)
		}
	}
	from, to := m.cgroup(old), m.cgroup(new)
	if exists(to.ctrl["freezer"]) {
		return nil, fmt.Errorf("rename cgroup %s: %w", old, errdefs.New(errdefs.ErrConflict, "cgroup "+new+" already exists"))
	}
	for i, dir := range from.dirs {
		if err := os.Rename(dir, to.dirs[i]); err != nil {
			for j := i - 1; j >= 0; j-- {
				os.Rename(to.dirs[j], from.dirs[j]) //nolint:errcheck // best effort: undo what was done
			}
			return nil, fmt.Errorf("rename cgroup %s to %s: %w", old, new, err)
		}
	}
	return to, nil
}

func (m *v1Manager) Load(name string) (Cgroup, error) {
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("load cgroup: %w", err)
	}
	c := m.cgroup(name)
	// In any hierarchy: a server killed between two of Create's (or Delete's, or Rename's) per-hierarchy steps
	// leaves a cgroup in some of them only, which reclaim must still find, load and remove.
	if !slices.ContainsFunc(c.dirs, exists) {
		return nil, fmt.Errorf("load cgroup %s: %w", name, errdefs.ErrNotFound)
	}
	return c, nil
}

// List implements Manager: the cgroups in any hierarchy (see Load).
func (m *v1Manager) List() ([]string, error) {
	seen := map[string]bool{}
	var names []string
	for _, dir := range m.dirs {
		got, err := listDirs(dir)
		if err != nil {
			return nil, fmt.Errorf("list cgroups: %w", err)
		}
		for _, n := range got {
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	sort.Strings(names)
	return names, nil
}

type v1Cgroup struct {
	name string
	ctrl map[string]string // controller -> this cgroup's directory
	dirs []string          // distinct directories
}

func (c *v1Cgroup) Name() string { return c.name }

// Update implements Cgroup.
func (c *v1Cgroup) Update(l Limits) error {
	if err := validLimits(l); err != nil {
		return fmt.Errorf("update cgroup %s: %w", c.name, err)
	}
	if err := c.apply(l); err != nil {
		return fmt.Errorf("update cgroup %s: %w", c.name, err)
	}
	return nil
}

func (c *v1Cgroup) file(ctrl, name string) string { return filepath.Join(c.ctrl[ctrl], name) }

// apply writes the limits.
func (c *v1Cgroup) apply(l Limits) error {
	if err := writeFile(c.file("cpu", "cpu.cfs_period_us"), strconv.Itoa(CPUPeriod)); err != nil {
		return err
	}
	if err := writeFile(c.file("cpu", "cpu.cfs_quota_us"), strconv.FormatInt(cpuQuota(l.CPUs), 10)); err != nil {
		return err
	}

	if err := c.applyMemory(l.MemoryBytes); err != nil {
		return err
	}
	return writeFile(c.file("pids", "pids.max"), tasksLimit(l.Pids))
}

// applyMemory writes the memory limit (0: none).
func (c *v1Cgroup) applyMemory(bytes int64) error {
	limit, memsw := c.file("memory", "memory.limit_in_bytes"), c.file("memory", "memory.memsw.limit_in_bytes")
	want := "-1"
	if bytes > 0 {
		want = strconv.FormatInt(bytes, 10)
	}
	// memory.memsw.limit_in_bytes must stay >= memory.limit_in_bytes (the kernel refuses either write with EINVAL
	// otherwise): when the limit goes down, write the memory limit first; when it goes up, memsw first.
	order := []string{limit, memsw}
	if exists(memsw) {
		cur, err := os.ReadFile(limit)
		if err != nil {
			return err
		}
		old, _ := strconv.ParseInt(strings.TrimSpace(string(cur)), 10, 64)
		if bytes <= 0 || bytes > old {
			order = []string{memsw, limit}
		}
	} else {
		order = order[:1]
	}
	for _, f := range order {
		if err := writeFile(f, want); err != nil {
			return err
		}
	}
	// OOM killer enabled (the default, written in case the parent was configured otherwise).
	return writeFile(c.file("memory", "memory.oom_control"), "0")
}

func (c *v1Cgroup) TasksLimit() (int64, error) {
	n, err := readTasksLimit(c.file("pids", "pids.max"))
	if err != nil {
		return 0, fmt.Errorf("cgroup %s: tasks limit: %w", c.name, err)
	}
	return n, nil
}

func (c *v1Cgroup) SetTasksLimit(n int64) error {
	if n < 0 {
		return fmt.Errorf("cgroup %s: tasks limit %d: %w", c.name, n, errdefs.ErrInvalid)
	}
	if err := writeFile(c.file("pids", "pids.max"), tasksLimit(n)); err != nil {
		return fmt.Errorf("cgroup %s: tasks limit: %w", c.name, err)
	}
	return nil
}

func (c *v1Cgroup) Add(pid int) error {
	for _, dir := range c.dirs {
		if err := addPid(dir, pid); err != nil {
			return fmt.Errorf("cgroup %s: add: %w", c.name, err)
		}
	}
	return nil
}

func (c *v1Cgroup) Procs() ([]int, error) {
	pids, err := readProcs(c.file("freezer", "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("cgroup %s: %w", c.name, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: procs: %w", c.name, err)
	}
	return pids, nil
}

func (c *v1Cgroup) state() (string, error) {
	b, err := os.ReadFile(c.file("freezer", "freezer.state"))
	return strings.TrimSpace(string(b)), err
}

// setState writes want to freezer.state and waits until the kernel reports it, re-writing it now and then (a
// freeze can stall in FREEZING while tasks are in uninterruptible sleep or being forked).
func (c *v1Cgroup) setState(ctx context.Context, want string) error {
	path := c.file("freezer", "freezer.state")
	if err := writeFile(path, want); err != nil {
		return err
	}
	i := 0
	return poll(ctx, func() (bool, error) {
		s, err := c.state()
		if err != nil || s == want {
			return s == want, err
		}
		if i++; i%10 == 0 {
			return false, writeFile(path, want)
		}
		return false, nil
	})
}

func (c *v1Cgroup) Freeze(ctx context.Context) error {
	if err := c.setState(ctx, "FROZEN"); err != nil {
		c.thawAfterFailure()
		return fmt.Errorf("cgroup %s: freeze: %w", c.name, err)
	}
	return nil
}

// thawAfterFailure undoes a half-done freeze, whatever the caller's context says.
func (c *v1Cgroup) thawAfterFailure() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.setState(ctx, "THAWED")
}

func (c *v1Cgroup) Thaw(ctx context.Context) error {
	if err := c.setState(ctx, "THAWED"); err != nil {
		return fmt.Errorf("cgroup %s: thaw: %w", c.name, err)
	}
	return nil
}

// Kill freezes the cgroup (so nothing can fork), SIGKILLs every process, thaws it (frozen processes only die
// once thawed) and waits for the cgroup to empty; it repeats the round if something is left after a second.
func (c *v1Cgroup) Kill(ctx context.Context) error {
	for {
		pids, err := c.Procs()
		if errors.Is(err, errdefs.ErrNotFound) && slices.ContainsFunc(c.dirs, exists) {
			// Not in the freezer's hierarchy (left half made or half removed): nothing there to freeze, so
			// whatever the other hierarchies hold is killed as it is.
			return c.killUnfrozen(ctx)
		}
		if err != nil {
			return fmt.Errorf("cgroup %s: kill: %w", c.name, err)
		}
		// A process can be in some hierarchies and not the freezer's (its mover was killed between two writes):
		// the cgroup cannot be removed while any hierarchy holds one, so those die too.
		if len(pids) == 0 {
			if stray, _ := c.procsAnywhere(); len(stray) == 0 {
				return nil
			}
		}
		if err := c.setState(ctx, "FROZEN"); err != nil {
			c.thawAfterFailure()
			return fmt.Errorf("cgroup %s: kill: freeze: %w", c.name, err)
		}
		pids, _ = c.procsAnywhere()
		err = killPids(pids)
		c.thawAfterFailure() // always thaw, even if ctx has ended
		if err != nil {
			return fmt.Errorf("cgroup %s: kill: %w", c.name, err)
		}
		if err := waitEmpty(ctx, c.procsAnywhere, time.Second); err != nil {
			return fmt.Errorf("cgroup %s: kill: %w", c.name, err)
		}
	}
}

// killUnfrozen kills the processes of a cgroup that has no freezer directory, until none is left.
func (c *v1Cgroup) killUnfrozen(ctx context.Context) error {
	for {
		pids, _ := c.procsAnywhere()
		if len(pids) == 0 {
			return nil
		}
		if err := killPids(pids); err != nil {
			return fmt.Errorf("cgroup %s: kill: %w", c.name, err)
		}
		if err := waitEmpty(ctx, c.procsAnywhere, time.Second); err != nil {
			return fmt.Errorf("cgroup %s: kill: %w", c.name, err)
		}
	}
}

// waitEmpty polls procs until it is empty or d has passed (then returns nil, letting the caller retry), or ctx
// ends (then returns ctx's error).
func waitEmpty(ctx context.Context, procs func() ([]int, error), d time.Duration) error {
	round, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	err := poll(round, func() (bool, error) {
		pids, err := procs()
		return len(pids) == 0, err
	})
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

// procsAnywhere is every process in the cgroup in any of its hierarchies (a hierarchy where it does not exist
// holds none); it never fails (the error is for waitEmpty).
func (c *v1Cgroup) procsAnywhere() ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for _, dir := range c.dirs {
		pids, _ := readProcs(filepath.Join(dir, "cgroup.procs"))
		for _, p := range pids {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out, nil
}

func (c *v1Cgroup) Delete() error {
	var errs []error
	for _, dir := range c.dirs {
		if err := rmdir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cgroup %s: delete: %w", c.name, err)
	}
	return nil
}

// KeptMemory implements MemoryKeeper: memory.force_empty (which the kernel refuses while the cgroup has tasks)
// reclaims what it can, then memory.usage_in_bytes is what is left.
func (c *v1Cgroup) KeptMemory() (int64, error) {
	if _, ok := c.ctrl["memory"]; !ok {
		return 0, fmt.Errorf("cgroup %s: no memory controller", c.name)
	}
	// A failed reclaim leaves more to report, never less.
	writeFile(c.file("memory", "memory.force_empty"), "0") //nolint:errcheck // see above
	n, err := readUint(c.file("memory", "memory.usage_in_bytes"))
	if err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", c.name, err)
	}
	return int64(n), nil
}

func (c *v1Cgroup) Stats() (Stats, error) {
	var s Stats
	var err error
	if s.MemoryBytes, err = readUint(c.file("memory", "memory.usage_in_bytes")); err != nil {
		return Stats{}, c.statsErr(err)
	}
	if s.OOMKills, _, err = readKey(c.file("memory", "memory.oom_control"), "oom_kill"); err != nil {
		return Stats{}, c.statsErr(err)
	}
	if _, ok := c.ctrl["pids"]; !ok { // a memory-only cgroup (CreateMemory)
		return s, nil
	}
	if s.Pids, err = readUint(c.file("pids", "pids.current")); err != nil {
		return Stats{}, c.statsErr(err)
	}
	if s.CPUNanos, err = readUint(c.file("cpuacct", "cpuacct.usage")); err != nil {
		return Stats{}, c.statsErr(err)
	}
	return s, nil
}

func (c *v1Cgroup) statsErr(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cgroup %s: stats: %w", c.name, errdefs.ErrNotFound)
	}
	return fmt.Errorf("cgroup %s: stats: %w", c.name, err)
}
