package cgroups

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"golang.org/x/sys/unix"
)

// v2Wanted are the controllers enabled for the sandboxes' cgroups when the hierarchy offers them.
var v2Wanted = []string{"cpu", "memory", "pids"}

type v2Manager struct {
	log     *slog.Logger
	parent  string   // absolute directory of the parent cgroup
	created []string // the directories NewV2 made for it, deepest first (RemoveCreatedParent)
}

// NewV2 returns a Manager for the cgroup2 file system mounted at mount (normally /sys/fs/cgroup), with its cgroups
// under parent (e.g. "ramify"). It creates the parent and enables the cpu, memory and pids controllers for its
// children where the hierarchy offers them. On a cgroup2 mount without controllers it still works for Add, Procs,
// Freeze, Thaw, Kill and Delete; limits and usage figures are then unavailable.
func NewV2(mount, parent string) (Manager, error) {
	return newV2(mount, parent, nil)
}

func newV2(mount, parent string, log *slog.Logger) (*v2Manager, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p, err := cleanParent(parent)
	if err != nil {
		return nil, fmt.Errorf("cgroups v2: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mount, &st); err != nil {
		return nil, fmt.Errorf("cgroups v2: %s: %w", mount, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil, fmt.Errorf("cgroups v2: %s is not a cgroup2 mount: %w", mount, errdefs.ErrInvalid)
	}
	m := &v2Manager{log: log, parent: filepath.Join(mount, p)}
	m.created = missingDirs(mount, m.parent)
	if err := os.MkdirAll(m.parent, 0o755); err != nil {
		return nil, fmt.Errorf("cgroups v2: create parent %s: %w", m.parent, err)
	}
	// Enable the wanted controllers down the path, from the mount's root to the parent itself (for its children).
	dir := mount
	for _, el := range append([]string{""}, strings.Split(p, "/")...) {
		dir = filepath.Join(dir, el)
		m.enableControllers(dir)
	}
	return m, nil
}

// enableControllers writes "+ctrl" to dir's cgroup.subtree_control for each wanted controller dir offers.
func (m *v2Manager) enableControllers(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		m.log.Debug("cannot read cgroup.controllers", "dir", dir, "err", err)
		return
	}
	avail := strings.Fields(string(b))
	for _, c := range v2Wanted {
		found := false
		for _, a := range avail {
			found = found || a == c
		}
		if !found {
			m.log.Debug("controller not available", "dir", dir, "controller", c)
			continue
		}
		if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), "+"+c); err != nil {
			m.log.Debug("cannot enable controller", "dir", dir, "controller", c, "err", err)
		}
	}
}

func (m *v2Manager) Version() int { return 2 }

// RemoveCreatedParent implements ParentRemover.
func (m *v2Manager) RemoveCreatedParent() error { return removeDirs(m.created) }

func (m *v2Manager) cgroup(name string) *v2Cgroup {
	return &v2Cgroup{name: name, dir: filepath.Join(m.parent, name), m: m}
}

func (m *v2Manager) Create(name string, l Limits) (Cgroup, error) {
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	if err := validLimits(l); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	c := m.cgroup(name)
	created, err := mkdir(c.dir)
	if err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	if !created {
		return nil, fmt.Errorf("create cgroup %s: %w", name, errdefs.New(errdefs.ErrConflict, "cgroup already exists"))
	}
	if err := m.apply(c, l); err != nil {
		_ = c.Delete()
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	m.log.Debug("created cgroup", "name", name, "cpus", l.CPUs, "memory", l.MemoryBytes, "pids", l.Pids)
	return c, nil
}

// apply writes the limits, skipping files whose controller is not enabled (they do not exist).
func (m *v2Manager) apply(c *v2Cgroup, l Limits) error {
	cpu := "max " + strconv.Itoa(CPUPeriod)
	if q := cpuQuota(l.CPUs); q > 0 {
		cpu = strconv.FormatInt(q, 10) + " " + strconv.Itoa(CPUPeriod)
	}
	mem, swap := "max", "max"
	if l.MemoryBytes > 0 {
		// Like v1's memsw limit equal to the memory limit: no swap on top of the memory limit.
		mem, swap = strconv.FormatInt(l.MemoryBytes, 10), "0"
	}
	pids := tasksLimit(l.Pids)
	for _, w := range []struct {
		file, value string
		limited     bool
	}{
		{"cpu.max", cpu, l.CPUs > 0},
		{"memory.max", mem, l.MemoryBytes > 0},
		{"memory.swap.max", swap, l.MemoryBytes > 0},
		{"pids.max", pids, l.Pids > 0},
	} {
		path := filepath.Join(c.dir, w.file)
		if !exists(path) {
			if w.limited && w.file != "memory.swap.max" {
				// A requested limit that cannot be applied: worth more than a debug line.
				m.log.Warn("controller file missing; limit not applied", "cgroup", c.name, "file", w.file, "value", w.value)
			} else {
				m.log.Debug("controller file missing; skipped", "cgroup", c.name, "file", w.file, "value", w.value)
			}
			continue
		}
		if err := writeFile(path, w.value); err != nil {
			return err
		}
	}
	return nil
}

func (m *v2Manager) Load(name string) (Cgroup, error) {
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("load cgroup: %w", err)
	}
	c := m.cgroup(name)
	if !exists(c.dir) {
		return nil, fmt.Errorf("load cgroup %s: %w", name, errdefs.ErrNotFound)
	}
	return c, nil
}

func (m *v2Manager) List() ([]string, error) {
	names, err := listDirs(m.parent)
	if err != nil {
		return nil, fmt.Errorf("list cgroups: %w", err)
	}
	return names, nil
}

type v2Cgroup struct {
	name string
	dir  string
	m    *v2Manager
}

// Update implements Cgroup.
func (c *v2Cgroup) Update(l Limits) error {
	if err := validLimits(l); err != nil {
		return fmt.Errorf("update cgroup %s: %w", c.name, err)
	}
	if err := c.m.apply(c, l); err != nil {
		return fmt.Errorf("update cgroup %s: %w", c.name, err)
	}
	return nil
}

func (c *v2Cgroup) TasksLimit() (int64, error) {
	n, err := readTasksLimit(c.file("pids.max"))
	if err != nil {
		return 0, fmt.Errorf("cgroup %s: tasks limit: %w", c.name, err)
	}
	return n, nil
}

func (c *v2Cgroup) SetTasksLimit(n int64) error {
	if n < 0 {
		return fmt.Errorf("cgroup %s: tasks limit %d: %w", c.name, n, errdefs.ErrInvalid)
	}
	if err := writeFile(c.file("pids.max"), tasksLimit(n)); err != nil {
		return fmt.Errorf("cgroup %s: tasks limit: %w", c.name, err)
	}
	return nil
}

func (c *v2Cgroup) Name() string { return c.name }

func (c *v2Cgroup) file(name string) string { return filepath.Join(c.dir, name) }

func (c *v2Cgroup) Add(pid int) error {
	if err := addPid(c.dir, pid); err != nil {
		return fmt.Errorf("cgroup %s: add: %w", c.name, err)
	}
	return nil
}

func (c *v2Cgroup) Procs() ([]int, error) {
	pids, err := readProcs(c.file("cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("cgroup %s: %w", c.name, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: procs: %w", c.name, err)
	}
	return pids, nil
}

// setFrozen writes cgroup.freeze and waits for cgroup.events to report the same "frozen" value.
func (c *v2Cgroup) setFrozen(ctx context.Context, frozen bool) error {
	want := uint64(0)
	if frozen {
		want = 1
	}
	if err := writeFile(c.file("cgroup.freeze"), strconv.FormatUint(want, 10)); err != nil {
		return err
	}
	return poll(ctx, func() (bool, error) {
		v, ok, err := readKey(c.file("cgroup.events"), "frozen")
		if err == nil && !ok {
			err = fmt.Errorf("%s has no frozen key", c.file("cgroup.events"))
		}
		return v == want, err
	})
}

func (c *v2Cgroup) Freeze(ctx context.Context) error {
	if err := c.setFrozen(ctx, true); err != nil {
		c.thawAfterFailure()
		return fmt.Errorf("cgroup %s: freeze: %w", c.name, err)
	}
	return nil
}

func (c *v2Cgroup) thawAfterFailure() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.setFrozen(ctx, false)
}

func (c *v2Cgroup) Thaw(ctx context.Context) error {
	if err := c.setFrozen(ctx, false); err != nil {
		return fmt.Errorf("cgroup %s: thaw: %w", c.name, err)
	}
	return nil
}

// Kill writes cgroup.kill (which the kernel applies atomically with respect to forks) and waits for the cgroup to
// empty, repeating if it has not after a second. Kernels before 5.14 have no cgroup.kill; there it freezes,
// SIGKILLs every process and thaws, as for v1.
func (c *v2Cgroup) Kill(ctx context.Context) error {
	hasKill := exists(c.file("cgroup.kill"))
	for {
		pids, err := c.Procs()
		if err != nil {
			return fmt.Errorf("cgroup %s: kill: %w", c.name, err)
		}
		if len(pids) == 0 {
			return nil
		}
		if hasKill {
			err = writeFile(c.file("cgroup.kill"), "1")
		} else {
			err = c.freezeKillThaw(ctx)
		}
		if err != nil {
			return fmt.Errorf("cgroup %s: kill: %w", c.name, err)
		}
		if err := waitEmpty(ctx, c.Procs, time.Second); err != nil {
			return fmt.Errorf("cgroup %s: kill: %w", c.name, err)
		}
	}
}

func (c *v2Cgroup) freezeKillThaw(ctx context.Context) error {
	if err := c.setFrozen(ctx, true); err != nil {
		c.thawAfterFailure()
		return fmt.Errorf("freeze: %w", err)
	}
	pids, err := c.Procs()
	if err == nil {
		err = killPids(pids)
	}
	c.thawAfterFailure()
	return err
}

func (c *v2Cgroup) Delete() error {
	if err := rmdir(c.dir); err != nil {
		return fmt.Errorf("cgroup %s: delete: %w", c.name, err)
	}
	return nil
}

// KeptMemory implements MemoryKeeper: memory.reclaim (Linux 5.19) asks the kernel to reclaim what it can (the
// page cache), then memory.current is what is left. Without memory.reclaim, memory.current is all it reports.
func (c *v2Cgroup) KeptMemory() (int64, error) {
	if n, err := readUint(c.file("memory.current")); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", c.name, err)
	} else if n > 0 {
		// EAGAIN when it could not reclaim all it was asked: what is left is read below.
		writeFile(c.file("memory.reclaim"), strconv.FormatUint(n, 10)) //nolint:errcheck // see above
	}
	n, err := readUint(c.file("memory.current"))
	if err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", c.name, err)
	}
	return int64(n), nil
}

// Stats reads memory.current, pids.current and memory.events; a figure whose controller is not enabled is 0.
func (c *v2Cgroup) Stats() (Stats, error) {
	if !exists(c.dir) {
		return Stats{}, fmt.Errorf("cgroup %s: stats: %w", c.name, errdefs.ErrNotFound)
	}
	var s Stats
	var err error
	if s.MemoryBytes, err = readUint(c.file("memory.current")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Stats{}, fmt.Errorf("cgroup %s: stats: %w", c.name, err)
	}
	if s.Pids, err = readUint(c.file("pids.current")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Stats{}, fmt.Errorf("cgroup %s: stats: %w", c.name, err)
	}
	if s.OOMKills, _, err = readKey(c.file("memory.events"), "oom_kill"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Stats{}, fmt.Errorf("cgroup %s: stats: %w", c.name, err)
	}
	usec, _, err := readKey(c.file("cpu.stat"), "usage_usec")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return Stats{}, fmt.Errorf("cgroup %s: stats: %w", c.name, err)
	}
	s.CPUNanos = usec * 1000
	return s, nil
}
