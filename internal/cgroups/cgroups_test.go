package cgroups

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

const (
	testParent  = "ramifytest"
	unifiedRoot = "/sys/fs/cgroup/unified"
)

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

// cleanupManager kills and deletes every cgroup under the test parent, then removes the parent directories.
func cleanupManager(t testing.TB, m Manager, parents []string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		names, err := m.List()
		if err != nil {
			t.Errorf("cleanup list: %v", err)
		}
		for _, n := range names {
			c, err := m.Load(n)
			if err != nil {
				continue
			}
			if err := c.Kill(ctx); err != nil {
				t.Errorf("cleanup kill %s: %v", n, err)
			}
			if err := c.Delete(); err != nil {
				t.Errorf("cleanup delete %s: %v", n, err)
			}
		}
		if rl, ok := m.(Releaser); ok {
			if err := rl.Release(); err != nil {
				t.Errorf("cleanup release: %v", err)
			}
		}
		for _, p := range parents {
			if err := rmdir(p); err != nil {
				t.Errorf("cleanup parent: %v", err)
			}
		}
	})
}

func newTestV1(t testing.TB) *v1Manager {
	t.Helper()
	requireRoot(t)
	m, err := newV1(DefaultMount, testParent, testLogger(t))
	if err != nil {
		t.Skipf("cgroup v1 not usable here: %v", err)
	}
	cleanupManager(t, m, m.dirs)
	return m
}

func newTestV2(t *testing.T) *v2Manager {
	t.Helper()
	requireRoot(t)
	m, err := newV2(unifiedRoot, testParent, testLogger(t))
	if err != nil {
		t.Skipf("cgroup v2 at %s not usable here: %v", unifiedRoot, err)
	}
	cleanupManager(t, m, []string{m.parent})
	return m
}

// child is a process started by startIn.
type child struct {
	cmd     *exec.Cmd
	errPath string        // its stderr, a file (a pipe would keep cmd.Wait waiting for its orphans)
	done    chan struct{} // closed when cmd.Wait has returned
	err     error         // cmd.Wait's result, once done is closed
}

// startIn starts argv held at a barrier (a shell waiting on stdin), moves it into each cgroup, then releases it:
// everything argv does happens inside the cgroups. The process is reaped in the background (so killed processes
// do not linger as zombies) and its process group is killed at the end of the test.
func startIn(t testing.TB, argv []string, cgs ...Cgroup) *child {
	t.Helper()
	cmd := exec.Command("/bin/sh", append([]string{"-c", `read _ && exec "$@"`, "sh"}, argv...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	errf, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	c := &child{cmd: cmd, errPath: errf.Name(), done: make(chan struct{})}
	cmd.Stderr = errf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
			t.Errorf("pid %d not reaped", cmd.Process.Pid)
		}
	})
	for _, cg := range cgs {
		if err := cg.Add(cmd.Process.Pid); err != nil {
			t.Fatalf("Add(%d): %v", cmd.Process.Pid, err)
		}
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	_ = stdin.Close()
	return c
}

func (c *child) stderr() string {
	b, _ := os.ReadFile(c.errPath)
	return string(b)
}

// wait returns cmd.Wait's result, or fails the test after d.
func (c *child) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-c.done:
		return c.err
	case <-time.After(d):
		t.Fatalf("pid %d still running after %v", c.cmd.Process.Pid, d)
		return nil
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// cpuTicks is utime+stime of pid from /proc/<pid>/stat.
func cpuTicks(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	u, _ := strconv.Atoi(f[11])
	s, _ := strconv.Atoi(f[12])
	return u + s
}

func procState(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "State:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestValidName(t *testing.T) {
	for _, n := range []string{"a", "sbx_0123", "A-b.c_d", "x.y", strings.Repeat("a", 255)} {
		if err := validName(n); err != nil {
			t.Errorf("validName(%q) = %v", n, err)
		}
	}
	for _, n := range []string{"", ".", "..", ".hidden", "a/b", "a b", "ü", "a\x00", strings.Repeat("a", 256)} {
		if err := validName(n); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("validName(%q) = %v, want ErrInvalid", n, err)
		}
	}
	for p, want := range map[string]string{"ramify": "ramify", "/ramify/": "ramify", "a/b": "a/b", "": "", "..": "", "a/../..": "", "a/.x": ""} {
		got, err := cleanParent(p)
		if want == "" && !errors.Is(err, errdefs.ErrInvalid) || want != "" && got != want {
			t.Errorf("cleanParent(%q) = %q, %v", p, got, err)
		}
	}
	if cpuQuota(0) != -1 || cpuQuota(1.5) != 150000 || cpuQuota(0.001) != 1000 || cpuQuota(2) != 200000 {
		t.Errorf("cpuQuota wrong")
	}
}

func TestDetect(t *testing.T) {
	requireRoot(t)
	m, err := Detect(testParent, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	switch v := m.(type) {
	case *v1Manager:
		cleanupManager(t, m, v.dirs)
	case *v2Manager:
		cleanupManager(t, m, []string{v.parent})
	}
	// On this kind of host (/sys/fs/cgroup a tmpfs of v1 hierarchies) Detect must pick v1.
	var st syscall.Statfs_t
	if err := syscall.Statfs(DefaultMount, &st); err == nil && st.Type != 0x63677270 && m.Version() != 1 {
		t.Errorf("Version = %d on a v1/hybrid host", m.Version())
	}
	t.Logf("detected cgroup v%d", m.Version())
}

func TestV1CreateLimits(t *testing.T) {
	m := newTestV1(t)
	l := Limits{CPUs: 1.5, MemoryBytes: 64 << 20, Pids: 20}
	cg, err := m.Create("limits", l)
	if err != nil {
		t.Fatal(err)
	}
	c := cg.(*v1Cgroup)
	checks := map[string]string{
		c.file("cpu", "cpu.cfs_period_us"):        "100000",
		c.file("cpu", "cpu.cfs_quota_us"):         "150000",
		c.file("memory", "memory.limit_in_bytes"): "67108864",
		c.file("pids", "pids.max"):                "20",
		c.file("freezer", "freezer.state"):        "THAWED",
		c.file("cpuacct", "cpuacct.usage"):        "0",
	}
	if exists(c.file("memory", "memory.memsw.limit_in_bytes")) {
		checks[c.file("memory", "memory.memsw.limit_in_bytes")] = "67108864"
	} else {
		t.Log("no memory.memsw files (swap accounting off): memsw limit not checked")
	}
	for path, want := range checks {
		if got := readTrim(t, path); got != want {
			t.Errorf("%s = %q, want %q", path, got, want)
		}
	}
	if oc := readTrim(t, c.file("memory", "memory.oom_control")); !strings.Contains(oc, "oom_kill_disable 0") {
		t.Errorf("memory.oom_control = %q", oc)
	}

	un, err := m.Create("unlimited", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	u := un.(*v1Cgroup)
	if got := readTrim(t, u.file("cpu", "cpu.cfs_quota_us")); got != "-1" {
		t.Errorf("unlimited quota = %s", got)
	}
	if got := readTrim(t, u.file("pids", "pids.max")); got != "max" {
		t.Errorf("unlimited pids.max = %s", got)
	}
	if got, _ := strconv.ParseInt(readTrim(t, u.file("memory", "memory.limit_in_bytes")), 10, 64); got < 1<<60 {
		t.Errorf("unlimited memory.limit_in_bytes = %d", got)
	}

	// Duplicates, bad names, bad limits.
	if _, err := m.Create("limits", Limits{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("duplicate Create = %v, want ErrConflict", err)
	}
	for _, n := range []string{"", ".x", "a/b", "../escape"} {
		if _, err := m.Create(n, Limits{}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Create(%q) = %v, want ErrInvalid", n, err)
		}
	}
	for _, bad := range []Limits{{CPUs: -1}, {MemoryBytes: -1}, {Pids: -5}} {
		if _, err := m.Create("bad", bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Create with %+v = %v, want ErrInvalid", bad, err)
		}
	}
	if exists(filepath.Join(m.ctrl["memory"], "bad")) {
		t.Errorf("rejected Create left a directory")
	}

	// List, Load.
	names, err := m.List()
	if err != nil || !slices.Equal(names, []string{"limits", "unlimited"}) {
		t.Errorf("List = %v, %v", names, err)
	}
	if _, err := m.Load("nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Load(missing) = %v", err)
	}
	loaded, err := m.Load("limits")
	if err != nil || loaded.Name() != "limits" {
		t.Fatalf("Load = %v, %v", loaded, err)
	}
	st, err := loaded.Stats()
	if err != nil || st.Pids != 0 || st.OOMKills != 0 {
		t.Errorf("Stats of empty cgroup = %+v, %v", st, err)
	}

	// Delete removes every controller's directory; deleting again is fine.
	if err := loaded.Delete(); err != nil {
		t.Fatal(err)
	}
	for ctrl, dir := range c.ctrl {
		if exists(dir) {
			t.Errorf("%s directory %s still exists", ctrl, dir)
		}
	}
	if err := loaded.Delete(); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	if _, err := loaded.Stats(); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stats after Delete = %v", err)
	}
}

// TestV1UpdateMemoryBothWays raises and lowers a memory limit: with swap accounting, memory.memsw.limit_in_bytes
// must stay >= memory.limit_in_bytes at every step, so the two files are written in the order the direction needs.
func TestV1UpdateMemoryBothWays(t *testing.T) {
	m := newTestV1(t)
	cg, err := m.Create("mem-updates", Limits{MemoryBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c := cg.(*v1Cgroup)
	for _, mb := range []int64{4096, 32, 512, 0, 128} {
		if err := cg.Update(Limits{MemoryBytes: mb << 20}); err != nil {
			t.Fatalf("update to %d MiB: %v", mb, err)
		}
		for _, f := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
			path := c.file("memory", f)
			if !exists(path) {
				continue
			}
			got, _ := strconv.ParseInt(readTrim(t, path), 10, 64)
			if mb == 0 && got < 1<<60 || mb > 0 && got != mb<<20 {
				t.Errorf("after update to %d MiB: %s = %d", mb, f, got)
			}
		}
	}
}

func TestV1AddFreezeThaw(t *testing.T) {
	m := newTestV1(t)
	cg, err := m.Create("freeze", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	c := cg.(*v1Cgroup)
	sleeper := startIn(t, []string{"sleep", "100"}, cg)
	busy := startIn(t, []string{"/bin/sh", "-c", "while :; do :; done"}, cg)

	procs, err := cg.Procs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(procs, sleeper.pid()) || !slices.Contains(procs, busy.pid()) {
		t.Fatalf("Procs = %v, want %d and %d", procs, sleeper.pid(), busy.pid())
	}
	// Every v1 hierarchy shows the process in <parent>/freeze.
	paths := map[string]string{}
	for _, line := range strings.Split(readTrim(t, fmt.Sprintf("/proc/%d/cgroup", sleeper.pid())), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 {
			for _, ctrl := range strings.Split(f[1], ",") {
				paths[ctrl] = f[2]
			}
		}
	}
	for _, ctrl := range v1Controllers {
		if paths[ctrl] != "/"+testParent+"/freeze" {
			t.Errorf("pid %d is in %s:%s, want /%s/freeze", sleeper.pid(), ctrl, paths[ctrl], testParent)
		}
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if err := cg.Add(gone.Process.Pid); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Add(exited pid) = %v, want ErrNotFound", err)
	}
	if err := cg.Add(0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Add(0) = %v, want ErrInvalid", err)
	}

	// Let the busy loop accumulate CPU time, then freeze.
	time.Sleep(200 * time.Millisecond)
	if err := cg.Freeze(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := readTrim(t, c.file("freezer", "freezer.state")); s != "FROZEN" {
		t.Errorf("freezer.state = %s", s)
	}
	for _, pid := range []int{sleeper.pid(), busy.pid()} {
		state := procState(pid)
		wchan := readTrim(t, fmt.Sprintf("/proc/%d/wchan", pid))
		t.Logf("frozen pid %d: State %q wchan %q", pid, state, wchan)
		// A v1-frozen task shows as D (disk sleep); a running one waits in __refrigerator, a sleeping one is
		// frozen in place (its wchan stays hrtimer_nanosleep).
		if !strings.HasPrefix(state, "D") {
			t.Errorf("pid %d not frozen: State %q wchan %q", pid, state, wchan)
		}
	}
	before := cpuTicks(t, busy.pid())
	time.Sleep(300 * time.Millisecond)
	if after := cpuTicks(t, busy.pid()); after != before {
		t.Errorf("busy loop used CPU while frozen: %d -> %d ticks", before, after)
	}

	if err := cg.Thaw(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := readTrim(t, c.file("freezer", "freezer.state")); s != "THAWED" {
		t.Errorf("freezer.state = %s", s)
	}
	before = cpuTicks(t, busy.pid())
	time.Sleep(300 * time.Millisecond)
	if after := cpuTicks(t, busy.pid()); after == before {
		t.Errorf("busy loop made no progress after Thaw")
	}
	if st := procState(sleeper.pid()); !strings.HasPrefix(st, "S") {
		t.Errorf("sleeper State after Thaw = %q", st)
	}

	// Delete of a populated cgroup is a conflict.
	if err := cg.Delete(); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Delete of populated cgroup = %v, want ErrConflict", err)
	}
	if err := cg.Kill(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := cg.Delete(); err != nil {
		t.Fatal(err)
	}
}

// testKillForkBomb runs a shell that keeps forking inside cg, checks it grew a tree, and kills it.
func testKillForkBomb(t *testing.T, cg Cgroup) {
	sh := startIn(t, []string{"/bin/sh", "-c", "while :; do sleep 1 & done"}, cg)
	time.Sleep(500 * time.Millisecond)
	procs, err := cg.Procs()
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) < 3 {
		t.Fatalf("fork loop has only %d processes", len(procs))
	}
	t.Logf("killing %d processes", len(procs))
	start := time.Now()
	if err := cg.Kill(ctxTimeout(t, 15*time.Second)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Kill took %v", d)
	}
	t.Logf("Kill took %v", time.Since(start))
	if procs, err := cg.Procs(); err != nil || len(procs) != 0 {
		t.Errorf("Procs after Kill = %v, %v", procs, err)
	}
	var ee *exec.ExitError
	if err := sh.wait(t, 5*time.Second); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("shell ended with %v, want SIGKILL", err)
	}
	// Still empty a moment later (nothing escaped and re-forked).
	time.Sleep(200 * time.Millisecond)
	if procs, _ := cg.Procs(); len(procs) != 0 {
		t.Errorf("Procs 200ms after Kill = %v", procs)
	}
	if err := cg.Delete(); err != nil {
		t.Errorf("Delete after Kill: %v", err)
	}
}

func TestV1KillForkBomb(t *testing.T) {
	m := newTestV1(t)
	cg, err := m.Create("forkbomb", Limits{Pids: 5000}) // a safety net only; the loop stays far below it
	if err != nil {
		t.Fatal(err)
	}
	testKillForkBomb(t, cg)
	// Killing an empty cgroup is a no-op; killing a missing one is not found.
	if err := cg.Kill(ctxTimeout(t, time.Second)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Kill of deleted cgroup = %v", err)
	}
}

func TestV1OOMKill(t *testing.T) {
	m := newTestV1(t)
	cg, err := m.Create("oom", Limits{MemoryBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	p := startIn(t, []string{"/usr/bin/python3", "-c", "b = bytearray(300<<20); print('allocated')"}, cg)
	werr := p.wait(t, 30*time.Second)
	var ee *exec.ExitError
	if !errors.As(werr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("python3 ended with %v (stderr %q), want SIGKILL by the OOM killer", werr, p.stderr())
	}
	st, err := cg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats after OOM: %+v", st)
	if st.OOMKills < 1 {
		t.Errorf("OOMKills = %d, want >= 1", st.OOMKills)
	}
}

func TestV1PidsLimit(t *testing.T) {
	m := newTestV1(t)
	cg, err := m.Create("pids", Limits{Pids: 20})
	if err != nil {
		t.Fatal(err)
	}
	c := cg.(*v1Cgroup)
	p := startIn(t, []string{"/bin/sh", "-c", "for i in $(seq 100); do sleep 30 & done; echo all-forked; wait"}, cg)
	werr := p.wait(t, 20*time.Second) // dash gives up at its first failed fork
	t.Logf("shell: %v, stderr %q", werr, p.stderr())
	if werr == nil || !strings.Contains(strings.ToLower(p.stderr()), "fork") {
		t.Errorf("no fork failure reported: %v, stderr %q", werr, p.stderr())
	}
	if v, _, err := readKey(c.file("pids", "pids.events"), "max"); err != nil || v < 1 {
		t.Errorf("pids.events max = %d, %v", v, err)
	}
	st, err := cg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Pids == 0 || st.Pids > 20 {
		t.Errorf("Stats.Pids = %d, want 1..20", st.Pids)
	}
	if st.CPUNanos == 0 {
		t.Errorf("Stats.CPUNanos = 0 after a shell forked in the cgroup")
	}
	// The test process is not in the cgroup and can still fork freely.
	if self := readTrim(t, "/proc/self/cgroup"); strings.Contains(self, testParent) {
		t.Errorf("test process is inside a test cgroup: %s", self)
	}
	for i := 0; i < 30; i++ {
		if err := exec.Command("true").Run(); err != nil {
			t.Fatalf("test process cannot fork: %v", err)
		}
	}
	if err := cg.Kill(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	// The tasks limit alone, up and back (a fork raises its parent's for its copies), and unlimited.
	for _, n := range []int64{25, 20, 0, 20} {
		if err := cg.SetTasksLimit(n); err != nil {
			t.Fatal(err)
		}
		if got, err := cg.TasksLimit(); err != nil || got != n {
			t.Errorf("TasksLimit after SetTasksLimit(%d) = %d, %v", n, got, err)
		}
	}
	if err := cg.SetTasksLimit(-1); err == nil {
		t.Error("SetTasksLimit(-1) accepted")
	}
}

func TestV2Lifecycle(t *testing.T) {
	m := newTestV2(t)
	if m.Version() != 2 {
		t.Fatal("version")
	}
	// Limits are skipped where the controllers are not enabled (on this host's controller-less unified mount).
	cg, err := m.Create("life", Limits{CPUs: 1, MemoryBytes: 64 << 20, Pids: 50})
	if err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"cpu.max": "100000 100000", "memory.max": "67108864", "pids.max": "50"} {
		path := filepath.Join(m.parent, "life", f)
		if exists(path) {
			if got := readTrim(t, path); got != want {
				t.Errorf("%s = %q, want %q", f, got, want)
			}
		} else {
			t.Logf("%s not available here (controller not enabled): limit untested", f)
		}
	}
	if _, err := m.Create("life", Limits{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("duplicate Create = %v", err)
	}
	if names, err := m.List(); err != nil || !slices.Equal(names, []string{"life"}) {
		t.Errorf("List = %v, %v", names, err)
	}
	if _, err := m.Load("nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Load(missing) = %v", err)
	}

	sleeper := startIn(t, []string{"sleep", "100"}, cg)
	busy := startIn(t, []string{"/bin/sh", "-c", "while :; do :; done"}, cg)
	procs, err := cg.Procs()
	if err != nil || !slices.Contains(procs, sleeper.pid()) || !slices.Contains(procs, busy.pid()) {
		t.Fatalf("Procs = %v, %v", procs, err)
	}
	if pc := readTrim(t, fmt.Sprintf("/proc/%d/cgroup", sleeper.pid())); !strings.Contains(pc, "0::/"+testParent+"/life") {
		t.Errorf("/proc/%d/cgroup = %s", sleeper.pid(), pc)
	}
	if _, err := cg.Stats(); err != nil {
		t.Errorf("Stats: %v", err)
	}

	time.Sleep(200 * time.Millisecond)
	if err := cg.Freeze(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if v, _, _ := readKey(filepath.Join(m.parent, "life", "cgroup.events"), "frozen"); v != 1 {
		t.Errorf("cgroup.events frozen = %d", v)
	}
	t.Logf("v2-frozen busy loop: State %q wchan %q", procState(busy.pid()),
		readTrim(t, fmt.Sprintf("/proc/%d/wchan", busy.pid())))
	before := cpuTicks(t, busy.pid())
	time.Sleep(300 * time.Millisecond)
	if after := cpuTicks(t, busy.pid()); after != before {
		t.Errorf("busy loop used CPU while frozen: %d -> %d", before, after)
	}
	if err := cg.Thaw(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if v, _, _ := readKey(filepath.Join(m.parent, "life", "cgroup.events"), "frozen"); v != 0 {
		t.Errorf("cgroup.events frozen = %d after Thaw", v)
	}
	before = cpuTicks(t, busy.pid())
	time.Sleep(300 * time.Millisecond)
	if after := cpuTicks(t, busy.pid()); after == before {
		t.Errorf("busy loop made no progress after Thaw")
	}

	if err := cg.Delete(); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Delete of populated cgroup = %v", err)
	}
	if err := cg.Kill(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := cg.Delete(); err != nil {
		t.Fatal(err)
	}
	if exists(filepath.Join(m.parent, "life")) {
		t.Errorf("directory left after Delete")
	}
	if err := cg.Delete(); err != nil {
		t.Errorf("second Delete: %v", err)
	}
}

func TestV2KillForkBomb(t *testing.T) {
	m := newTestV2(t)
	cg, err := m.Create("forkbomb", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	testKillForkBomb(t, cg)
}

// TestV2KillFallback exercises the freeze/kill/thaw path used on kernels without cgroup.kill.
func TestV2KillFallback(t *testing.T) {
	m := newTestV2(t)
	cg, err := m.Create("fallback", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	c := cg.(*v2Cgroup)
	startIn(t, []string{"/bin/sh", "-c", "while :; do sleep 1 & done"}, cg)
	time.Sleep(300 * time.Millisecond)
	ctx := ctxTimeout(t, 15*time.Second)
	for {
		procs, err := c.Procs()
		if err != nil {
			t.Fatal(err)
		}
		if len(procs) == 0 {
			break
		}
		if err := c.freezeKillThaw(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitEmpty(ctx, c.Procs, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if v, _, _ := readKey(c.file("cgroup.events"), "frozen"); v != 0 {
		t.Errorf("left frozen")
	}
}

func TestNewV2RejectsNonCgroup2(t *testing.T) {
	requireRoot(t)
	if _, err := NewV2(t.TempDir(), testParent); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("NewV2 on a plain directory = %v, want ErrInvalid", err)
	}
}

// A v1 rename keeps the processes, the limits and the usage, in every hierarchy; a name taken is a conflict and
// changes nothing.
func TestV1Rename(t *testing.T) {
	m := newTestV1(t)
	cg, err := m.Create("pooled", Limits{Pids: 50})
	if err != nil {
		t.Fatal(err)
	}
	sleeper := startIn(t, []string{"sleep", "100"}, cg)
	if _, err := m.Create("taken", Limits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Rename("pooled", "taken"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("rename onto an existing cgroup: %v", err)
	}
	renamed, err := m.Rename("pooled", "sandbox")
	if err != nil {
		t.Fatal(err)
	}
	if procs, err := renamed.Procs(); err != nil || !slices.Contains(procs, sleeper.pid()) {
		t.Fatalf("renamed cgroup's processes: %v %v", procs, err)
	}
	for _, line := range strings.Split(readTrim(t, fmt.Sprintf("/proc/%d/cgroup", sleeper.pid())), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && slices.ContainsFunc(strings.Split(f[1], ","), func(c string) bool { return slices.Contains(v1Controllers, c) }) {
			if f[2] != "/"+testParent+"/sandbox" {
				t.Errorf("after the rename the process is in %s", line)
			}
		}
	}
	if got := readTrim(t, filepath.Join(renamed.(*v1Cgroup).ctrl["pids"], "pids.max")); got != "50" {
		t.Errorf("pids.max after the rename: %s", got)
	}
	if _, err := m.Load("pooled"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("old name still loads: %v", err)
	}
	if err := renamed.Update(Limits{Pids: 70}); err != nil {
		t.Fatal(err)
	}
	renamed.Kill(context.Background()) //nolint:errcheck
	if err := renamed.Delete(); err != nil {
		t.Fatal(err)
	}
}

// TestRemoveCreatedParent: a manager removes the parent directories it made (a server whose start-up failed
// leaves no cgroup behind), and only those: a parent that existed before it stays.
func TestRemoveCreatedParent(t *testing.T) {
	requireRoot(t)
	parent := testParent + "-undo/owner"
	m, err := newV1(DefaultMount, parent, testLogger(t))
	if err != nil {
		t.Skipf("cgroup v1 not usable here: %v", err)
	}
	t.Cleanup(func() { m.RemoveCreatedParent() }) //nolint:errcheck // the keeper too
	if len(m.created) != 2*len(m.dirs) {
		t.Fatalf("created %v for %d hierarchies, want the parent and its own parent in each", m.created, len(m.dirs))
	}
	again, err := newV1(DefaultMount, parent, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := again.RemoveCreatedParent(); err != nil || len(again.created) != 0 {
		t.Fatalf("a manager of an existing parent removed %v (%v)", again.created, err)
	}
	for _, d := range m.dirs {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("parent %s gone after a manager that did not make it removed what it made", d)
		}
	}
	if err := m.RemoveCreatedParent(); err != nil {
		t.Fatal(err)
	}
	for _, d := range m.created {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s still there after RemoveCreatedParent", d)
		}
	}
}

// A cgroup left in some hierarchies only (a server killed between Create's, Rename's or Delete's per-hierarchy
// steps) is listed, loads, and is killed and removed, a process in it included: reclaim found only the freezer's.
func TestV1PartialCgroupIsReclaimable(t *testing.T) {
	m := newTestV1(t)
	cg, err := m.Create("partial", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	p := startIn(t, []string{"/bin/sleep", "60"}, cg)
	c := cg.(*v1Cgroup)
	// The process leaves the freezer's directory (back to the hierarchy's root), which then goes.
	if err := os.WriteFile(filepath.Join(DefaultMount, "freezer", "cgroup.procs"), []byte(strconv.Itoa(p.cmd.Process.Pid)), 0o644); err != nil {
		t.Skipf("cannot move a process in the freezer hierarchy: %v", err)
	}
	if err := os.Remove(c.ctrl["freezer"]); err != nil {
		t.Fatal(err)
	}
	names, err := m.List()
	if err != nil || !slices.Contains(names, "partial") {
		t.Fatalf("List = %v, %v: the cgroup without a freezer directory is missing", names, err)
	}
	got, err := m.Load("partial")
	if err != nil {
		t.Fatalf("Load of a cgroup without a freezer directory: %v", err)
	}
	if err := got.Kill(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := got.Delete(); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if names, _ := m.List(); slices.Contains(names, "partial") {
		t.Fatalf("still listed after Delete: %v", names)
	}
	p.wait(t, 10*time.Second) //nolint:errcheck // killed
}

// TestV1KeepsTheFreezerActive: a v1 manager keeps an empty cgroup frozen for its life, so that freezing and
// thawing sandboxes never flips the kernel's freezer static key (a text patch on every CPU, ~5 ms of CPU each
// on a paravirtualized guest); reclaim never sees it (List), a later manager of the same parent takes it over,
// and Release removes it, once.
func TestV1KeepsTheFreezerActive(t *testing.T) {
	m := newTestV1(t)
	if m.keeper == "" {
		t.Fatal("no keeper cgroup")
	}
	state := func() string {
		b, err := os.ReadFile(filepath.Join(m.keeper, "freezer.state"))
		if err != nil {
			return err.Error()
		}
		return strings.TrimSpace(string(b))
	}
	if got := state(); got != "FROZEN" {
		t.Fatalf("keeper %s is %s, want FROZEN", m.keeper, got)
	}
	names, err := m.List()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, keeperName) {
		t.Fatalf("List names the keeper: %v", names)
	}
	// A sandbox's freeze and thaw work beside it, and leave it frozen.
	c, err := m.Create("keeper-test", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Thaw(ctx); err != nil {
		t.Fatal(err)
	}
	if got := state(); got != "FROZEN" {
		t.Fatalf("keeper is %s after a sandbox's thaw, want FROZEN", got)
	}
	again, err := newV1(DefaultMount, testParent, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if again.keeper != m.keeper {
		t.Fatalf("a later manager keeps %q, want the same keeper %q", again.keeper, m.keeper)
	}
	if err := m.Release(); err != nil {
		t.Fatal(err)
	}
	if m.keeper != "" {
		t.Fatalf("keeper still recorded after Release: %q", m.keeper)
	}
	if _, err := os.Stat(again.keeper); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("keeper %s still there after Release: %v", again.keeper, err)
	}
	if err := again.Release(); err != nil {
		t.Fatalf("a second Release of a removed keeper: %v", err)
	}
}
