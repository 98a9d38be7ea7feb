package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/testserver"
)

// killSandboxProcesses SIGKILLs, from the host, every process in the sandbox's cgroup (its agent and
// interpreter): a stand-in for an out-of-band failure while the server is down.
func killSandboxProcesses(id string) error {
	n := 0
	for _, pid := range sandboxPids(id) {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("no process of %s found", id)
	}
	return nil
}

// sandboxPids returns the host pids of a sandbox's processes (from its cgroup).
func sandboxPids(id string) []int { return testserver.SandboxPids(id) }

// procField returns a field of /proc/<pid>/status ("" if the process is gone).
func procField(pid int, field string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// familyInit returns the host pid of the family init of sandbox id: the parent of its agent.
func familyInit(t testing.TB, id string) int {
	t.Helper()
	for _, pid := range sandboxPids(id) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmd), "__agent") {
			ppid, _ := strconv.Atoi(procField(pid, "PPid"))
			return ppid
		}
	}
	t.Fatalf("no agent process found for %s", id)
	return 0
}

// spareAgents returns the host pids of the idle (unclaimed: in no sandbox's cgroup) spare agents of the family whose init is initPid.
func spareAgents(initPid int) []int {
	var out []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		cmd, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(cmd), "__agent\x00--spare") {
			continue
		}
		pid, _ := strconv.Atoi(strings.Split(f, "/")[2])
		if cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); strings.Contains(string(cg), "/sbx_") {
			continue // claimed: it is a sandbox's agent now (a spare is in its family's cgroup, fam_...)
		}
		if ppid, _ := strconv.Atoi(procField(pid, "PPid")); ppid == initPid {
			out = append(out, pid)
		}
	}
	return out
}

// waitUntil polls cond every 20 ms until it holds, failing the test with what() once timeout has passed.
func waitUntil(t testing.TB, timeout time.Duration, cond func() bool, what func() string) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(what())
		}
	}
}

// waitSpares waits (up to 15 s) until the family whose init is initPid has at least want idle spare agents.
func waitSpares(t testing.TB, initPid, want int) {
	t.Helper()
	waitUntil(t, 15*time.Second, func() bool { return len(spareAgents(initPid)) >= want },
		func() string {
			return fmt.Sprintf("%d spare agents after 15 s, want %d", len(spareAgents(initPid)), want)
		})
}

// TestFamilyInitThreadsDoNotGrowWithMembers: a family init serves a channel and seccomp listeners for every
// agent of its family (sandboxes and spares) on the Go runtime's poller, not on an OS thread each (27 threads for a
// family of one fork of 3 and its spares, ~36 KB each with its stacks, before).
func TestFamilyInitThreadsDoNotGrowWithMembers(t *testing.T) {
	s := testserver.Start(t, "--fork-ahead", "0")
	parent := create(t, s, nil)
	value(t, s, parent, "1")
	kids, err := s.Client.Fork(ctxT(t), parent, 8)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		value(t, s, k, "1")
	}
	initPid := familyInit(t, parent)
	waitSpares(t, initPid, 8) // the refill after the fork: 8 more agents, each with a channel and a listener
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", initPid))
	if err != nil {
		t.Fatal(err)
	}
	if members := 1 + len(kids) + len(spareAgents(initPid)); len(tasks) > 10 {
		t.Errorf("the family init has %d threads for %d agents: a thread per agent or listener", len(tasks), members)
	}
}
