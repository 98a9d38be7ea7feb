// Package security holds the attack tests of docs/security.md: each one attacks a real server's sandboxes from
// inside, as sandbox code would, and must fail.
package security

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// The server under test gives sandboxes created without disk_mib this quota (--disk-mib).
const diskServerDefault = 96

// diskQuota is what the quota tests ask for: small, so that filling it takes a fraction of a second.
const diskQuota = 64

func diskCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func diskCreate(t *testing.T, s *testserver.Server, req client.CreateRequest) *client.Sandbox {
	t.Helper()
	sb, err := s.Client.Create(diskCtx(t), req)
	if err != nil {
		t.Fatalf("create %+v: %v", req, err)
	}
	t.Cleanup(func() { s.Client.Delete(context.Background(), sb.ID) }) //nolint:errcheck // may be gone already
	return sb
}

func diskSh(t *testing.T, s *testserver.Server, id, cmd string) *client.ExecResult {
	t.Helper()
	res, err := s.Client.Exec(diskCtx(t), id, client.ExecRequest{Cmd: cmd})
	if err != nil {
		t.Fatalf("exec %q in %s: %v", cmd, id, err)
	}
	return res
}

// diskFill writes mib MiB into path inside sandbox id with dd (fsync'd) and returns the result.
func diskFill(t *testing.T, s *testserver.Server, id, path string, mib int) *client.ExecResult {
	t.Helper()
	return diskSh(t, s, id, fmt.Sprintf("dd if=/dev/zero of=%s bs=1M count=%d conv=fsync 2>&1", path, mib))
}

// diskWantQuotaHit checks that a write of more than the quota failed with EDQUOT or ENOSPC.
func diskWantQuotaHit(t *testing.T, what string, res *client.ExecResult) {
	t.Helper()
	if res.ExitCode == 0 {
		t.Fatalf("%s: writing past the %d MiB quota succeeded:\n%s", what, diskQuota, res.Stdout)
	}
	if !strings.Contains(res.Stdout, "Disk quota exceeded") && !strings.Contains(res.Stdout, "No space left on device") {
		t.Fatalf("%s: the write failed, but not for the quota (exit %d):\n%s", what, res.ExitCode, res.Stdout)
	}
	// dd reports what it wrote before the error: no more than the quota (a larger limit would let more through).
	m := regexp.MustCompile(`(?m)^(\d+) bytes`).FindStringSubmatch(res.Stdout)
	if m == nil {
		t.Fatalf("%s: no byte count in dd's output:\n%s", what, res.Stdout)
	}
	if n, _ := strconv.ParseInt(m[1], 10, 64); n > diskQuota<<20 {
		t.Fatalf("%s: %d bytes written under a %d MiB quota", what, n, diskQuota)
	}
}

// diskWantWrite checks that a write succeeded.
func diskWantWrite(t *testing.T, what string, res *client.ExecResult) {
	t.Helper()
	if res.ExitCode != 0 {
		t.Fatalf("%s: write failed (exit %d):\n%s", what, res.ExitCode, res.Stdout)
	}
}

func diskGet(t *testing.T, s *testserver.Server, id string) *client.Sandbox {
	t.Helper()
	sb, err := s.Client.Get(diskCtx(t), id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return sb
}

// TestDiskQuota fills a sandbox's disk from inside it, with dd and from Python, and checks that the quota
// stops it, that it stops only that sandbox, and that the quota follows the sandbox through fork and pause.
func TestDiskQuota(t *testing.T) {
	s := testserver.Start(t, "--disk-mib", fmt.Sprint(diskServerDefault))

	t.Run("BadValues", func(t *testing.T) {
		for _, body := range []string{`{"disk_mib": 10}`, `{"disk_mib": -1}`, `{"disk_mib": 1048577}`, `{"disk_mib": "1G"}`, `{"disk_mib": 1.5}`} {
			req, _ := http.NewRequest("POST", s.URL+"/v1/sandboxes", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+s.Key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || !bytes.Contains(b, []byte("disk_mib")) {
				t.Errorf("POST %s: %d %s, want 400 naming disk_mib", body, resp.StatusCode, b)
			}
			if resp.StatusCode == http.StatusCreated {
				var sb client.Sandbox
				if json.Unmarshal(b, &sb) == nil {
					s.Client.Delete(context.Background(), sb.ID) //nolint:errcheck
				}
			}
		}
	})

	t.Run("Default", func(t *testing.T) {
		sb := diskCreate(t, s, client.CreateRequest{})
		if sb.DiskMiB != diskServerDefault {
			t.Fatalf("disk_mib = %d, want the server's --disk-mib %d", sb.DiskMiB, diskServerDefault)
		}
		if got := diskGet(t, s, sb.ID).DiskMiB; got != diskServerDefault {
			t.Fatalf("GET disk_mib = %d, want %d", got, diskServerDefault)
		}
	})

	// GET shows what counts against the quota, with memory, CPU and tasks from the cgroups.
	t.Run("Usage", func(t *testing.T) {
		sb := diskCreate(t, s, client.CreateRequest{DiskMiB: diskQuota})
		before := diskGet(t, s, sb.ID).Usage
		if before == nil || before.DiskBytes == nil {
			t.Fatalf("GET of a running sandbox with a quota: usage %+v, want disk_bytes", before)
		}
		diskWantWrite(t, "fill half", diskFill(t, s, sb.ID, "/root/half", diskQuota/2))
		diskSh(t, s, sb.ID, "sync")
		u := diskGet(t, s, sb.ID).Usage
		if u == nil || u.DiskBytes == nil {
			t.Fatalf("usage after a write: %+v", u)
		}
		if grew := *u.DiskBytes - *before.DiskBytes; grew < (diskQuota/2)<<20 || grew > diskQuota<<20 {
			t.Errorf("disk_bytes grew by %d after a %d MiB write", grew, diskQuota/2)
		}
		if u.MemBytes == 0 || u.CPUSeconds <= 0 || u.Pids < 1 {
			t.Errorf("usage %+v: want memory, CPU time and the interpreter's task", u)
		}
		if l, err := s.Client.List(diskCtx(t), client.ListOptions{}); err != nil || len(l) == 0 || l[0].Usage != nil {
			t.Errorf("list: %v, want sandboxes without usage", err)
		}
	})

	t.Run("FillForkPause", func(t *testing.T) {
		a := diskCreate(t, s, client.CreateRequest{DiskMiB: diskQuota})
		neighbour := diskCreate(t, s, client.CreateRequest{DiskMiB: diskQuota})
		if a.DiskMiB != diskQuota || diskGet(t, s, a.ID).DiskMiB != diskQuota {
			t.Fatalf("disk_mib = %d, want %d", a.DiskMiB, diskQuota)
		}

		// Fill it with dd: stopped at the quota.
		diskWantQuotaHit(t, "dd", diskFill(t, s, a.ID, "/root/big", 3*diskQuota))
		// A file written through the API then is a 507 (insufficient storage) that says why, not a 500.
		if _, err := s.Client.WriteFile(diskCtx(t), a.ID, "/root/api.bin", bytes.NewReader(make([]byte, 4<<20)), 0o644); err == nil {
			t.Errorf("a files PUT into a full sandbox succeeded")
		} else if ae, ok := err.(*client.APIError); !ok || ae.StatusCode != http.StatusInsufficientStorage || !strings.Contains(ae.Message, "quota") {
			t.Errorf("a files PUT into a full sandbox: %v, want 507 saying the quota is exceeded", err)
		}
		// From Python too: the interpreter sees EDQUOT as an OSError.
		ex, err := s.Client.RunCode(diskCtx(t), a.ID, client.RunCodeRequest{Code: `
import errno, os
def fill():
    try:
        with open("/root/py", "wb") as f:
            for _ in range(` + fmt.Sprint(3*diskQuota) + `):
                f.write(b"x" * (1 << 20))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    return "ok"
fill()`})
		if err != nil {
			t.Fatal(err)
		}
		if ex.Error != nil || ex.Value == nil || (*ex.Value != "'EDQUOT'" && *ex.Value != "'ENOSPC'") {
			t.Fatalf("python write past the quota: value %v error %+v, want EDQUOT or ENOSPC", ex.Value, ex.Error)
		}

		// The neighbour and the server are untouched while a is full.
		diskWantWrite(t, "neighbour", diskFill(t, s, neighbour.ID, "/root/big", diskQuota/2))
		other := diskCreate(t, s, client.CreateRequest{})
		diskWantWrite(t, "a sandbox created while a is full", diskFill(t, s, other.ID, "/root/big", diskQuota))

		// The user deletes files: a can write again.
		diskWantWrite(t, "rm", diskSh(t, s, a.ID, "rm -f /root/big /root/py && sync"))
		diskWantWrite(t, "after rm", diskFill(t, s, a.ID, "/root/small", diskQuota/4))

		// A fork child inherits the quota, shown and enforced; its parent's data counts towards it.
		kids, err := s.Client.Fork(diskCtx(t), a.ID, 1)
		if err != nil {
			t.Fatalf("fork: %v", err)
		}
		child := kids[0]
		t.Cleanup(func() { s.Client.Delete(context.Background(), child) }) //nolint:errcheck
		if got := diskGet(t, s, child).DiskMiB; got != diskQuota {
			t.Fatalf("fork child's disk_mib = %d, want the parent's %d", got, diskQuota)
		}
		diskWantQuotaHit(t, "fork child", diskFill(t, s, child, "/root/big", 3*diskQuota))
		// The child filling its quota leaves its parent's alone.
		diskWantWrite(t, "parent after the child filled its quota", diskFill(t, s, a.ID, "/root/small2", diskQuota/4))

		// The quota survives pause and resume.
		if _, _, err := s.Client.Pause(diskCtx(t), a.ID); err != nil {
			t.Fatalf("pause: %v", err)
		}
		if sb, err := s.Client.WaitStatus(diskCtx(t), a.ID, "paused"); err != nil || sb.Status != "paused" {
			t.Fatalf("wait paused: %v %+v", err, sb)
		}
		if got := diskGet(t, s, a.ID).DiskMiB; got != diskQuota {
			t.Fatalf("paused: disk_mib = %d, want %d", got, diskQuota)
		}
		// A fork of the paused sandbox inherits it too (fork takes no shape).
		var pf struct {
			Children []string `json:"children"`
		}
		if err := s.PostJSON(diskCtx(t), "/v1/sandboxes/"+a.ID+"/fork", map[string]any{"n": 1, "start_paused": true}, &pf); err != nil || len(pf.Children) != 1 {
			t.Fatalf("fork of the paused sandbox: %v %+v", err, pf)
		}
		t.Cleanup(func() { s.Client.Delete(context.Background(), pf.Children[0]) }) //nolint:errcheck
		if got := diskGet(t, s, pf.Children[0]).DiskMiB; got != diskQuota {
			t.Fatalf("fork of a paused sandbox: disk_mib = %d, want %d", got, diskQuota)
		}
		if _, _, err := s.Client.Resume(diskCtx(t), a.ID); err != nil {
			t.Fatalf("resume: %v", err)
		}
		if sb, err := s.Client.WaitStatus(diskCtx(t), a.ID, "running"); err != nil || sb.Status != "running" {
			t.Fatalf("wait running: %v %+v", err, sb)
		}
		if got := diskGet(t, s, a.ID).DiskMiB; got != diskQuota {
			t.Fatalf("resumed: disk_mib = %d, want %d", got, diskQuota)
		}
		if got := diskSh(t, s, a.ID, "cat /root/small | wc -c"); strings.TrimSpace(got.Stdout) != fmt.Sprint(diskQuota/4<<20) {
			t.Fatalf("resumed: /root/small has %q bytes", got.Stdout)
		}
		diskWantQuotaHit(t, "resumed", diskFill(t, s, a.ID, "/root/big", 3*diskQuota))
	})
}
