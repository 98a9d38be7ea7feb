package testserver

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
)

// Ctx is a context for one test's calls, cancelled when the test ends (at most 5 minutes).
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// Create creates a sandbox (req may be nil) and fails the test unless it is running.
func (s *Server) Create(t testing.TB, req *client.CreateRequest) string {
	t.Helper()
	if req == nil {
		req = &client.CreateRequest{}
	}
	sb, err := s.Client.Create(Ctx(t), *req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if sb.Status != "running" {
		t.Fatalf("new sandbox status %q", sb.Status)
	}
	return sb.ID
}

// Run runs code in sandbox id and returns the execution, failing the test if the call itself fails.
func (s *Server) Run(t testing.TB, id, code string) *client.Execution {
	t.Helper()
	ex, err := s.Client.RunCode(Ctx(t), id, client.RunCodeRequest{Code: code})
	if err != nil {
		t.Fatalf("run_code %q: %v", code, err)
	}
	return ex
}

// Value runs code and returns its trailing expression's repr, failing the test on an exception.
func (s *Server) Value(t testing.TB, id, code string) string {
	t.Helper()
	ex := s.Run(t, id, code)
	if ex.Error != nil {
		t.Fatalf("run_code %q raised %s: %s\n%s", code, ex.Error.Name, ex.Error.Value, ex.Error.Traceback)
	}
	if ex.Value == nil {
		return ""
	}
	return *ex.Value
}

// Sh runs a shell command in sandbox id, failing the test if the call itself fails.
func (s *Server) Sh(t testing.TB, id, cmd string) *client.ExecResult {
	t.Helper()
	res, err := s.Client.Exec(Ctx(t), id, client.ExecRequest{Cmd: cmd})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return res
}

// Fork forks sandbox id into n children and returns their ids.
func (s *Server) Fork(t testing.TB, id string, n int) []string {
	t.Helper()
	kids, err := s.Client.Fork(Ctx(t), id, n)
	if err != nil {
		t.Fatalf("fork %s: %v", id, err)
	}
	return kids
}

// SandboxPids returns the host pids of a sandbox's processes (from its cgroup, in every hierarchy).
func SandboxPids(id string) []int {
	files, _ := filepath.Glob("/sys/fs/cgroup/*/ramify/*/" + id + "/cgroup.procs")
	more, _ := filepath.Glob("/sys/fs/cgroup/ramify/*/" + id + "/cgroup.procs")
	seen := map[int]bool{}
	var out []int
	for _, f := range append(files, more...) {
		b, _ := os.ReadFile(f)
		for _, p := range strings.Fields(string(b)) {
			if pid, _ := strconv.Atoi(p); pid > 0 && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out
}

// AgentPid returns the host pid of a sandbox's agent (0 if none is found).
func AgentPid(id string) int {
	for _, pid := range SandboxPids(id) {
		if cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); strings.Contains(string(cmd), "__agent") {
			return pid
		}
	}
	return 0
}
