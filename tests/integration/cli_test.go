package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// The CLI, as a user runs it: the built binary with RAMIFY_API_URL and RAMIFY_API_KEY in the environment.
func TestCLIAgainstRealServer(t *testing.T) {
	s := testserver.Start(t)
	bin := testserver.Binary(t)
	env := []string{"RAMIFY_API_URL=" + s.URL, "RAMIFY_API_KEY=" + s.Key}
	cli := func(args ...string) (string, string, int) { t.Helper(); return runCLI(t, bin, env, args...) }
	out, errOut, code := cli("sandbox", "create", "--meta", "who=cli")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "sbx_") || !strings.Contains(errOut, "ramify run "+id) {
		t.Fatalf("create: %q %q %d", out, errOut, code)
	}
	if out, _, code := cli("run", id, "x = 20"); code != 0 {
		t.Fatalf("run: %q %d", out, code)
	}
	if out, _, _ := cli("run", id, "print('hi'); x * 2 + 2"); !strings.Contains(out, "hi") || !strings.Contains(out, "42") {
		t.Fatalf("run value: %q", out)
	}
	if out, _, code := cli("run", id, "print('a', end='')\ndisplay({'k': 1})\nprint('b')\n'v'"); code != 0 || out != "a\n{'k': 1}\nb\n'v'\n" {
		t.Errorf("run with a display: %q, exit %d", out, code)
	}
	if _, errOut, code := cli("run", id, "1/0"); code != 1 || !strings.Contains(errOut, "ZeroDivisionError") {
		t.Fatalf("run error: %q %d", errOut, code)
	}
	if out, _, code := cli("exec", id, "--", "sh", "-c", "echo from-exec; exit 3"); code != 3 || out != "from-exec\n" {
		t.Fatalf("exec: %q %d", out, code)
	}
	local := filepath.Join(t.TempDir(), "in.txt")
	os.WriteFile(local, []byte("copied"), 0o644)
	if _, errOut, code := cli("cp", local, id+":/root/in.txt"); code != 0 {
		t.Fatalf("cp up: %q", errOut)
	}
	if out, _, _ := cli("exec", id, "cat /root/in.txt"); out != "copied" {
		t.Fatalf("cp content: %q", out)
	}
	out, _, code = cli("fork", id, "-n", "2")
	kids := strings.Fields(out)
	if code != 0 || len(kids) != 2 {
		t.Fatalf("fork: %q %d", out, code)
	}
	cli("exec", kids[1], "echo b > /root/b.txt")
	if out, _, _ := cli("diff", kids[0], kids[1]); !strings.Contains(out, "+ /root/b.txt") {
		t.Fatalf("diff: %q", out)
	}
	if out, _, _ := cli("tree", id); !strings.Contains(out, kids[0]) || !strings.Contains(out, kids[1]) {
		t.Fatalf("tree: %q", out)
	}
	if out, _, _ := cli("ls"); strings.Count(out, "sbx_") < 3 {
		t.Fatalf("ls: %q", out)
	}
	if _, errOut, code := cli("merge", id, kids[1]); code != 0 {
		t.Fatalf("merge: %q", errOut)
	}
	if out, _, _ := cli("exec", id, "cat /root/b.txt"); out != "b\n" {
		t.Fatalf("after merge: %q", out)
	}
	if _, _, code := cli("rm", id, kids[0]); code != 0 {
		t.Fatal("rm failed")
	}
	if _, errOut, code := cli("get", id); code != 1 || !strings.Contains(errOut, "sandbox "+id+" was deleted") {
		t.Fatalf("get after rm: %q %d", errOut, code)
	}
}

// runCLI runs the built binary with env added to this process's environment; it returns stdout, stderr and the
// exit code.
func runCLI(t *testing.T, bin string, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// What users of a CLI expect (issue 15): help and version exit 0, errors say what is wrong (a local file, a
// timeout) and are JSON under --json, exec --json keeps empty fields, an address without a scheme works, and the
// keepalive and per-run env features.
func TestCLIAsUsersExpect(t *testing.T) {
	bin := testserver.Binary(t)
	// Without a server: help, version and flag usage.
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"--version"}, {"serve", "-h"}, {"image", "build", "-h"}, {"help", "exec"}} {
		out, errOut, code := runCLI(t, bin, nil, args...)
		if code != 0 || strings.Contains(errOut, "help requested") || !strings.Contains(out+errOut, "ramify") {
			t.Errorf("ramify %q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	if out, _, _ := runCLI(t, bin, nil, "--version"); !strings.HasPrefix(out, "ramify ") {
		t.Errorf("--version: %q", out)
	}

	s := testserver.Start(t)
	env := []string{"RAMIFY_API_URL=" + s.URL, "RAMIFY_API_KEY=" + s.Key}
	cli := func(args ...string) (string, string, int) { t.Helper(); return runCLI(t, bin, env, args...) }
	out, _, code := cli("sandbox", "create", "--timeout", "60")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "sbx_") {
		t.Fatalf("create: %q %d", out, code)
	}

	missing := filepath.Join(t.TempDir(), "missing")
	if _, errOut, code := cli("cp", missing, id+":/root/x"); code != 1 || !strings.Contains(errOut, "local file "+missing) || strings.Contains(errOut, "server") {
		t.Errorf("cp of a missing local file: exit %d, %q", code, errOut)
	}
	if _, errOut, code := cli("run", id, "--timeout", "1", "import time\ntime.sleep(30)"); code != 1 || !strings.Contains(errOut, "TimeoutError: execution exceeded 1s") {
		t.Errorf("run timeout: exit %d, %q", code, errOut)
	}
	out, _, code = cli("get", "sbx_00000000000000000000000000000000", "--json")
	var jerr map[string]string
	if code != 1 || json.Unmarshal([]byte(out), &jerr) != nil || jerr["error"] != "sandbox not found" {
		t.Errorf("get --json of an unknown sandbox: exit %d, stdout %q", code, out)
	}
	out, _, code = cli("exec", id, "--json", "--", "true")
	var res map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res["stderr"] != "" || res["stdout"] != "" {
		t.Errorf("exec --json: exit %d, %q", code, out)
	}
	hostPort := strings.TrimPrefix(s.URL, "http://")
	if out, errOut, code := runCLI(t, bin, []string{"RAMIFY_API_URL=" + hostPort, "RAMIFY_API_KEY=" + s.Key}, "get", id, "--json"); code != 0 || !strings.Contains(out, id) {
		t.Errorf("RAMIFY_API_URL without a scheme: exit %d, %q %q", code, out, errOut)
	}

	// Per-run env: visible to that run only.
	if out, errOut, code := cli("run", id, "--env", "GREETING=hi", "import os; os.environ.get('GREETING')"); code != 0 || out != "'hi'\n" {
		t.Errorf("run --env: exit %d, %q %q", code, out, errOut)
	}
	if out, _, _ := cli("run", id, "import os; os.environ.get('GREETING')"); out != "" {
		t.Errorf("the env of an earlier run leaked into the next: %q", out)
	}

	// Keepalive: the deadline moves to now + the new timeout.
	before := time.Now()
	out, errOut, code := cli("set-timeout", id, "1h", "--json")
	var sb client.Sandbox
	if code != 0 || json.Unmarshal([]byte(out), &sb) != nil || sb.TimeoutS != 3600 || sb.ExpiresAt == nil ||
		sb.ExpiresAt.Before(before.Add(time.Hour-time.Second)) {
		t.Fatalf("set-timeout: exit %d, %q %q", code, out, errOut)
	}
	if out, _, code := cli("set-timeout", id, "0"); code != 0 || !strings.Contains(out, "no timeout") {
		t.Errorf("set-timeout 0: exit %d, %q", code, out)
	}

	// get shows what the sandbox uses now.
	if out, _, code := cli("get", id); code != 0 || !strings.Contains(out, "usage:") || !strings.Contains(out, "memory ") {
		t.Errorf("get: exit %d, %q: want a usage line", code, out)
	}

	// interrupt stops a run in progress; with nothing running it says so.
	started := make(chan struct{})
	done := make(chan *client.Execution, 1)
	go func() {
		var once sync.Once
		ex, err := s.Client.RunCodeStream(ctxT(t), id, client.RunCodeRequest{Code: "import time\nprint('go', flush=True)\ntime.sleep(600)"},
			func(client.Event) { once.Do(func() { close(started) }) })
		if err != nil {
			t.Errorf("run_code: %v", err)
			once.Do(func() { close(started) })
		}
		done <- ex
	}()
	<-started
	if out, errOut, code := cli("interrupt", id); code != 0 || !strings.Contains(out, "stopped 1 run_code and 0 exec") {
		t.Errorf("interrupt: exit %d, %q %q", code, out, errOut)
	}
	if ex := <-done; ex == nil || !ex.Interrupted {
		t.Errorf("the interrupted run: %+v", ex)
	}
	if out, _, code := cli("interrupt", id, "--only", "exec"); code != 0 || !strings.Contains(out, "nothing was running") {
		t.Errorf("interrupt with nothing running: exit %d, %q", code, out)
	}
	if _, errOut, code := cli("interrupt", id, "--only", "all"); code == 0 || !strings.Contains(errOut, "--only") {
		t.Errorf("interrupt --only all: exit %d, %q", code, errOut)
	}
}
