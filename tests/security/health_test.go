package security

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// If ramify's own process for a sandbox dies anyway (killed from the host here; out of memory or a bug in life),
// the server notices within a second or two and restarts the sandbox on its files with a fresh interpreter; the
// API never keeps answering "running" for a sandbox that cannot answer.
func TestLostAgentIsRestored(t *testing.T) {
	s := testserver.Start(t)
	id := s.Create(t, nil)
	kid := s.Fork(t, id, 1)[0]
	for _, sb := range []string{id, kid} {
		s.Sh(t, sb, "echo kept > /root/f.txt")
		s.Value(t, sb, "x = 1")
		agentPid := testserver.AgentPid(sb)
		if agentPid == 0 {
			t.Fatalf("%s: no agent found", sb)
		}
		if err := syscall.Kill(agentPid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		var out string
		waitFor(t, 10*time.Second, func() bool {
			r, err := s.Client.Exec(testserver.Ctx(t), sb, client.ExecRequest{Cmd: "cat /root/f.txt"})
			if err == nil {
				out = r.Stdout
			} else if ae, ok := err.(*client.APIError); !ok || ae.StatusCode != 503 {
				t.Errorf("%s: a call before the restart: %v, want 503 (the agent is gone, try again)", sb, err)
			}
			return err == nil
		})
		t.Logf("%s: answers again %v after its agent was killed", sb, time.Since(killed))
		if out != "kept\n" {
			t.Errorf("%s: files after the restart: %q", sb, out)
		}
		// A restarted event says so (the history, from an id the server never gave: all of it).
		restarted := ""
		ectx, cancel := context.WithTimeout(testserver.Ctx(t), 5*time.Second)
		s.Client.Events(ectx, client.EventsOptions{Sandbox: sb, After: 1 << 62}, func(ev client.LifecycleEvent) error { //nolint:errcheck // ends at the event or the timeout
			if ev.Type == "restarted" {
				restarted = ev.Reason
				cancel()
			}
			return nil
		})
		cancel()
		if !strings.Contains(restarted, "died") {
			t.Errorf("%s: no restarted event saying what died (reason %q)", sb, restarted)
		}
		if p := testserver.AgentPid(sb); p == 0 || p == agentPid {
			t.Errorf("%s: agent after the restart: %d (killed: %d)", sb, p, agentPid)
		}
		// The state's loss is reported, as an interpreter that died between calls is, before the fresh
		// interpreter runs anything: the code of that call does not run.
		if ex := s.Run(t, sb, "x = 2"); ex.Error == nil || ex.Error.Name != "InterpreterDied" || !strings.Contains(ex.Error.Value, "was restarted") {
			t.Errorf("%s: the first run_code after the restart: %+v %+v, want InterpreterDied saying it was restarted", sb, ex, ex.Error)
		}
		if ex := s.Run(t, sb, "x"); ex.Error == nil || ex.Error.Name != "NameError" {
			t.Errorf("%s: a restarted sandbox runs a fresh interpreter: %+v", sb, ex)
		}
		if info, err := s.Client.Get(testserver.Ctx(t), sb); err != nil || info.Status != "running" {
			t.Errorf("%s: %+v %v", sb, info, err)
		}
	}
	// The family init dies: every member is restored.
	parent := s.Create(t, nil)
	kids := s.Fork(t, parent, 2)
	initPid := familyInit(t, parent)
	agents := map[string]int{}
	for _, sb := range append(kids, parent) {
		agents[sb] = testserver.AgentPid(sb)
	}
	if err := syscall.Kill(initPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, sb := range append(kids, parent) {
		// The init's death takes its PID namespace's processes with it, a moment later on a loaded machine: a
		// call made before that would still reach the old interpreter. Wait for the restart's new agent.
		waitFor(t, 10*time.Second, func() bool { p := testserver.AgentPid(sb); return p != 0 && p != agents[sb] })
		died := false
		waitFor(t, 10*time.Second, func() bool {
			ex, err := s.Client.RunCode(testserver.Ctx(t), sb, client.RunCodeRequest{Code: "'ok'"})
			died = died || err == nil && ex.Error != nil && ex.Error.Name == "InterpreterDied"
			return err == nil && ex.Error == nil && ex.Value != nil && *ex.Value == "'ok'"
		})
		if !died {
			t.Errorf("%s: restarted after its family init died, and no run_code said its state was lost", sb)
		}
	}
	if ev := s.Log(); strings.Count(ev, "sandbox restarted") < 5 {
		t.Errorf("restarts logged: %d, want 5", strings.Count(ev, "sandbox restarted"))
	}
}

// A sandbox that cannot be restarted (its layer is gone here) turns error with the reason, instead of answering
// 500 for ever while saying "running".
func TestLostSandboxThatCannotBeRestoredIsMarkedError(t *testing.T) {
	s := testserver.Start(t)
	id := s.Create(t, nil)
	layers, _ := filepath.Glob(filepath.Join(s.DataDir, "layers", "*", id, "upper"))
	if len(layers) != 1 {
		t.Fatalf("layer of %s: %v", id, layers)
	}
	if err := os.RemoveAll(filepath.Dir(layers[0])); err != nil {
		t.Logf("remove layer: %v", err) // a btrfs subvolume: its files go, which is enough to break a restart
	}
	if err := syscall.Kill(testserver.AgentPid(id), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var info *client.Sandbox
	waitFor(t, 10*time.Second, func() bool {
		var err error
		info, err = s.Client.Get(testserver.Ctx(t), id)
		return err == nil && info.Status == "error"
	})
	if !strings.Contains(info.Error, "died") || !strings.Contains(info.Error, "could not be restarted") {
		t.Errorf("error does not say why: %q", info.Error)
	}
	if err := s.Client.Delete(testserver.Ctx(t), id); err != nil {
		t.Errorf("delete of the errored sandbox: %v", err)
	}
}

// familyInit is the host pid of the family init of sandbox id (the parent of its agent).
func familyInit(t *testing.T, id string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", testserver.AgentPid(id)))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var ppid int
	fmt.Sscan(f[1], &ppid)
	return ppid
}

// waitFor polls cond until it holds, failing the test after limit.
func waitFor(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The family's own machinery lives inside limits of the family's own: its init and the spare agents it keeps
// are in a cgroup named after the family (with a tasks limit), not in the server's, and that cgroup goes with
// the family's last sandbox. The init and every agent run under a seccomp filter.
func TestFamilyMachineryInFamilyCgroup(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0") // one family: the sandbox's
	id := s.Create(t, nil)
	s.Fork(t, id, 2) // a family that has forked keeps spare agents
	info, err := s.Client.Get(testserver.Ctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	inv := s.Inventory()
	if len(inv.Inits) != 1 {
		t.Fatalf("family inits: %v", inv.Inits)
	}
	pidsCgroup := func(pid int) string {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.SplitN(l, ":", 3); len(f) == 3 && (f[1] == "pids" || f[0] == "0") {
				return f[2]
			}
		}
		return ""
	}
	want := "/ramify/" + s.Owner() + "/" + info.FamilyID
	procs := []int{inv.Inits[0]}
	// The init's children that are spares (the others are the sandboxes' agents, in their sandboxes' cgroups);
	// the family refills its spares in the background after the fork.
	spares := func() []int {
		var out []int
		stats, _ := filepath.Glob("/proc/[0-9]*/stat")
		for _, st := range stats {
			b, _ := os.ReadFile(st)
			var pid, ppid int
			if i := strings.LastIndexByte(string(b), ')'); i > 0 {
				fmt.Sscanf(string(b[i+2:]), "%c %d", new(byte), &ppid)
				fmt.Sscan(string(b), &pid)
			}
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			// A spare claimed by a fork child (started for the fork, or ahead of it) is that child's agent now,
			// in the child's cgroup: not one of these.
			if ppid == inv.Inits[0] && strings.Contains(string(cmd), "--spare") && !strings.Contains(pidsCgroup(pid), "/sbx_") {
				out = append(out, pid)
			}
		}
		return out
	}
	// The family also makes children ahead in the background, each claiming a spare: one listed here may have
	// become a child's agent (in the child's cgroup) by the time it is checked, so look until one is checked
	// while still a spare.
	checked := 0
	for deadline := time.Now().Add(15 * time.Second); checked == 0 && time.Now().Before(deadline); {
		for _, pid := range spares() {
			if got := pidsCgroup(pid); got != "" && !strings.Contains(got, "/sbx_") {
				procs = append(procs, pid)
				checked++
			}
		}
		if checked == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if checked == 0 {
		t.Errorf("no spare agent found among the init's children")
	}
	for _, pid := range procs {
		// A spare may also sit in a cgroup of its own, <family>.s<pid>, ready to become a sandbox's.
		got := pidsCgroup(pid)
		if pid != inv.Inits[0] && strings.Contains(got, "/sbx_") {
			continue // claimed by a child made ahead between the look and this check: that child's agent now
		}
		if got != want && !strings.HasPrefix(got, want+".s") {
			t.Errorf("process %d is in cgroup %q, want %q", pid, got, want)
		}
		// Every one of them has a tasks limit.
		max, err := os.ReadFile("/sys/fs/cgroup/pids" + got + "/pids.max")
		if err != nil {
			max, err = os.ReadFile("/sys/fs/cgroup" + got + "/pids.max") // cgroup v2
		}
		if err != nil || strings.TrimSpace(string(max)) == "max" {
			t.Errorf("process %d's cgroup %s has no tasks limit: %q %v", pid, got, max, err)
		}
	}
	// The init, the spares and the sandbox's agent run under a seccomp filter (the machinery's deny-list).
	for _, pid := range append(procs, testserver.AgentPid(id)) {
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if !strings.Contains(string(status), "\nSeccomp:\t2\n") {
			t.Errorf("process %d is not filtered:\n%s", pid, status)
		}
	}
	limit, err := os.ReadFile("/sys/fs/cgroup/pids" + want + "/pids.max")
	if err != nil {
		limit, err = os.ReadFile("/sys/fs/cgroup" + want + "/pids.max")
	}
	if err != nil || strings.TrimSpace(string(limit)) == "max" {
		t.Errorf("family cgroup's tasks limit: %q %v", limit, err)
	}
	// The cgroup ends with the family: removed when its last sandbox is deleted.
	list, err := s.Client.List(testserver.Ctx(t), client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if err := s.Client.Delete(testserver.Ctx(t), sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if cgs := s.Inventory().Cgroups; slices.Contains(cgs, info.FamilyID) {
		t.Errorf("family cgroup %s left after its last sandbox: %v", info.FamilyID, cgs)
	}
}
