package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/internal/testserver"
)

// The CLI, as a user runs it: the built binary with RAMIFY_API_URL and RAMIFY_API_KEY in the environment.
func TestCLIAgainstRealServer(t *testing.T) {
	s := testserver.Start(t)
	bin := testserver.Binary(t)
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "RAMIFY_API_URL="+s.URL, "RAMIFY_API_KEY="+s.Key)
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
	if _, errOut, code := cli("get", id); code == 0 || !strings.Contains(errOut, "not found") {
		t.Fatalf("get after rm: %q %d", errOut, code)
	}
}
