package security

import (
	"fmt"
	"os"
	"path/filepath"
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
			}
			return err == nil
		})
		t.Logf("%s: answers again %v after its agent was killed", sb, time.Since(killed))
		if out != "kept\n" {
			t.Errorf("%s: files after the restart: %q", sb, out)
		}
		if p := testserver.AgentPid(sb); p == 0 || p == agentPid {
			t.Errorf("%s: agent after the restart: %d (killed: %d)", sb, p, agentPid)
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
	if err := syscall.Kill(initPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, sb := range append(kids, parent) {
		waitFor(t, 10*time.Second, func() bool {
			ex, err := s.Client.RunCode(testserver.Ctx(t), sb, client.RunCodeRequest{Code: "'ok'"})
			return err == nil && ex.Error == nil && ex.Value != nil && *ex.Value == "'ok'"
		})
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
