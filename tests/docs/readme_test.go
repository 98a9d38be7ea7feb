package docs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// readmeBlock returns the body of the n-th (from 0) fenced block of language lang in README.md's section that
// starts with the heading line, failing the test if there is none: a renamed heading or a block that moved shows
// here, not as an example that silently stopped being checked.
func readmeBlock(t *testing.T, heading, lang string, n int) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	at := strings.Index(readme, "\n"+heading+"\n")
	if at < 0 {
		t.Fatalf("README.md has no heading %q", heading)
	}
	section := readme[at+len(heading)+2:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	fence := "```" + lang + "\n"
	for i := 0; ; i++ {
		start := strings.Index(section, fence)
		if start < 0 {
			t.Fatalf("README.md's %q has no %s block number %d", heading, lang, n+1)
		}
		body := section[start+len(fence):]
		end := strings.Index(body, "```")
		if end < 0 {
			t.Fatalf("README.md's %q: a %s block is not closed", heading, lang)
		}
		if i == n {
			return body[:end]
		}
		section = body[end+3:]
	}
}

// runAsUser runs script with bash (-e: the first failing command ends it) as a user of the README would, in dir,
// with the two variables the server told them to export and with the ramify under test first on the PATH under the
// name the README uses (on Debian's PATH), and returns what it printed. A script that fails, or takes over two minutes, fails the test.
func runAsUser(t *testing.T, srv *testserver.Server, dir, script string, env ...string) string {
	t.Helper()
	bin := t.TempDir()
	if err := os.Symlink(testserver.Binary(t), filepath.Join(bin, "ramify")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", script)
	cmd.Dir = dir
	// Debian's own PATH for root: the README's python3 is Debian's (a pyenv or conda one ahead of it on a build
	// machine's PATH lacks the system packages the offline install uses).
	cmd.Env = append(os.Environ(), "RAMIFY_API_URL="+srv.URL, "RAMIFY_API_KEY="+srv.Key,
		"PATH="+bin+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	t.Logf("output:\n%s", out)
	if err != nil {
		t.Fatalf("the README's block failed: %v\n%s", err, script)
	}
	return string(out)
}

// wants fails the test for each pattern out does not match.
func wants(t *testing.T, out string, patterns ...string) {
	t.Helper()
	for _, p := range patterns {
		if !regexp.MustCompile(p).MatchString(out) {
			t.Errorf("output does not match %q", p)
		}
	}
}

// leftover fails the test if the server still holds a sandbox: each example ends by deleting what it made.
func leftover(t *testing.T, srv *testserver.Server) {
	t.Helper()
	list, err := srv.Client.List(context.Background(), client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		t.Errorf("sandbox %s (%s) left after the example", sb.ID, sb.Status)
	}
}

// The README's 30-second examples work the first time, as written: the curl block, the CLI block and the Python
// SDK's install and example, each pasted whole into a shell against a real server.
func TestReadmeExamplesRunAsWritten(t *testing.T) {
	srv := testserver.Start(t)

	t.Run("curl", func(t *testing.T) {
		out := runAsUser(t, srv, t.TempDir(), readmeBlock(t, "## 30 seconds with curl", "sh", 0))
		wants(t, out,
			`"value":\s*"42"`,               // x + 1 after x = 41
			`f\.txt`,                        // the exec's ls
			`"added":\s*\["/root/g\.txt"\]`, // the child's new file in the diff
			`"value":\s*"100"`)              // the parent after the merge
		if regexp.MustCompile(`"error":\s*[^n\s]`).MatchString(out) {
			t.Errorf("a call answered an error")
		}
		leftover(t, srv)
	})

	t.Run("cli", func(t *testing.T) {
		out := runAsUser(t, srv, t.TempDir(), readmeBlock(t, "## The same with the CLI", "sh", 0))
		wants(t, out,
			`(?m)^2$`,               // ramify run $SB 'x + 1'
			`(?m)^\+ /root/g\.txt$`, // the diff
			`merged sbx_\w+ into sbx_\w+`,
			`(?m)^100$`) // ramify run $SB 'x' after the merge
		leftover(t, srv)
	})

	t.Run("python", func(t *testing.T) {
		// The install runs where the README runs it, the repository's root, but on a copy of sdk/python (pip
		// writes its build files beside the sources), into a home of its own (~/ramify-venv).
		root := t.TempDir()
		home := t.TempDir()
		if err := os.MkdirAll(filepath.Join(root, "sdk"), 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-r", "../../sdk/python", filepath.Join(root, "sdk")).CombinedOutput(); err != nil {
			t.Fatalf("copy the SDK: %v\n%s", err, out)
		}
		runAsUser(t, srv, root, readmeBlock(t, "## The same with the Python SDK", "sh", 0), "HOME="+home)
		example := filepath.Join(t.TempDir(), "example.py")
		if err := os.WriteFile(example, []byte(readmeBlock(t, "## The same with the Python SDK", "python", 0)), 0o644); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		out := runAsUser(t, srv, dir, "~/ramify-venv/bin/python "+example, "HOME="+home)
		wants(t, out,
			`(?m)^2$`,   // print(sb.run_code("x + 1").value)
			`(?m)^bin$`, // ls /
			`'modified': \['/root/out\.txt'\]`)
		if png, err := os.ReadFile(filepath.Join(dir, "chart.png")); err != nil || !strings.HasPrefix(string(png), "\x89PNG") {
			t.Errorf("chart.png is not a PNG (%v)", err)
		}
		leftover(t, srv)
	})
}
