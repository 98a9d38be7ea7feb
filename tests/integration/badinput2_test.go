package integration

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

func tarOf(t *testing.T, names ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
		tw.Write([]byte("x"))
	}
	tw.Close()
	return buf.Bytes()
}

// Input that used to be accepted and then misbehaved is refused with 400, on a real sandbox.
func TestBadInput2(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0")
	id := s.Create(t, nil)
	base := "/v1/sandboxes/" + id

	t.Run("create with a missing cwd", func(t *testing.T) {
		code, body := raw(t, s, "POST", "/v1/sandboxes", s.Key, []byte(`{"cwd": "/no/such/dir"}`))
		wantError(t, code, body, 400, "cwd /no/such/dir is not a directory in the sandbox")
		list, err := s.Client.List(ctxT(t), client.ListOptions{})
		if err != nil || len(list) != 1 {
			t.Errorf("sandboxes after the refused create: %d, %v (want only the first one)", len(list), err)
		}
		sb, err := s.Client.Create(ctxT(t), client.CreateRequest{Cwd: "/tmp"})
		if err != nil {
			t.Fatalf("create with cwd /tmp: %v", err)
		}
		if out := sh(t, s, sb.ID, "pwd").Stdout; strings.TrimSpace(out) != "/tmp" {
			t.Errorf("pwd in a sandbox made with cwd /tmp: %q", out)
		}
	})
	t.Run("exec with a missing cwd", func(t *testing.T) {
		code, body := raw(t, s, "POST", base+"/exec", s.Key, []byte(`{"cmd": "pwd", "cwd": "/nope"}`))
		wantError(t, code, body, 400, "cwd /nope is not a directory in the sandbox")
		res, err := s.Client.Exec(ctxT(t), id, client.ExecRequest{Cmd: "pwd", Cwd: "/etc"})
		if err != nil || strings.TrimSpace(res.Stdout) != "/etc" {
			t.Errorf("exec with cwd /etc: %+v, %v", res, err)
		}
	})
	t.Run("NUL in cmd", func(t *testing.T) {
		code, body := raw(t, s, "POST", base+"/exec", s.Key, []byte(`{"cmd": "echo a\u0000b"}`))
		wantError(t, code, body, 400, "cmd must not contain NUL bytes")
	})
	t.Run("fork n null", func(t *testing.T) {
		code, body := raw(t, s, "POST", base+"/fork", s.Key, []byte(`{"n": null}`))
		wantError(t, code, body, 400, "n must be an integer between 1 and 32")
	})
	t.Run("list status bogus", func(t *testing.T) {
		code, body := raw(t, s, "GET", "/v1/sandboxes?status=bogus", s.Key, nil)
		wantError(t, code, body, 400, `unknown status "bogus"`)
	})
	t.Run("pseudo file systems", func(t *testing.T) {
		sh(t, s, id, "ln -sfn / /root/top")
		mounts := func() string {
			return sh(t, s, id, "awk '{print $5}' /proc/self/mountinfo | sort | tr '\\n' ' '").Stdout
		}
		before := mounts()
		if !strings.Contains(before, "/proc ") {
			t.Fatalf("no /proc mount in the sandbox to begin with: %q", before)
		}
		for _, p := range []string{"/proc", "/sys", "/dev", "/dev/shm", "/root/top/proc", "/root/top/dev/shm"} {
			code, body := raw(t, s, "DELETE", base+"/files?recursive=true&path="+p, s.Key, nil)
			wantError(t, code, body, 400, "refusing")
		}
		code, body := raw(t, s, "PUT", base+"/files?path=/proc/sys/kernel/hostname", s.Key, []byte("evil"))
		wantError(t, code, body, 400, "refusing")
		code, body = raw(t, s, "POST", base+"/files/mkdir", s.Key, []byte(`{"path": "/dev/evil"}`))
		wantError(t, code, body, 400, "refusing")
		code, body = raw(t, s, "GET", base+"/files?path=/proc/self/status", s.Key, nil)
		wantError(t, code, body, 400, "pseudo file system")
		code, body = raw(t, s, "GET", base+"/files/list?path=/proc", s.Key, nil)
		wantError(t, code, body, 400, "pseudo file system")
		if code, _ := raw(t, s, "GET", base+"/files/stat?path=/proc", s.Key, nil); code != 200 {
			t.Errorf("stat /proc: %d, want 200", code)
		}
		code, body = raw(t, s, "GET", base+"/files?path=/proc/version", s.Key, nil)
		wantError(t, code, body, 400, "pseudo file system")
		// The sandbox still has its mounts.
		if after := mounts(); after != before {
			t.Errorf("the sandbox's mounts changed: %q before, %q after", before, after)
		}
	})
	t.Run("tar upload all or nothing", func(t *testing.T) {
		sh(t, s, id, "mkdir -p /root/up && echo old > /root/up/a")
		code, body := raw(t, s, "PUT", base+"/files/archive?path=/root/up", s.Key, tarOf(t, "a", "b", "c/d", "../escape"))
		wantError(t, code, body, 400, "leaves the destination")
		res := sh(t, s, id, "cd /root/up && find . | sort | tr '\\n' ' ' && cat a")
		if res.Stdout != ". ./a old\n" {
			t.Errorf("after a failed upload, /root/up holds %q; want only the old a", res.Stdout)
		}
	})
}

// A diff is capped at 10,000 entries per list and says it was cut.
func TestDiffCap(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0")
	id := s.Create(t, nil)
	kid := s.Fork(t, id, 1)[0]
	sh(t, s, kid, "mkdir /root/many && cd /root/many && seq 1 10050 | xargs touch")
	code, body := raw(t, s, "GET", fmt.Sprintf("/v1/sandboxes/%s/diff/%s", id, kid), s.Key, nil)
	if code != 200 {
		t.Fatalf("diff: %d %v", code, body)
	}
	b, _ := json.Marshal(body)
	var res struct {
		Added     []string `json:"added"`
		Truncated bool     `json:"truncated"`
	}
	json.Unmarshal(b, &res)
	if len(res.Added) != 10000 || !res.Truncated {
		t.Errorf("diff of 10,050 new files: %d added, truncated %v; want 10000, true", len(res.Added), res.Truncated)
	}
}
