package security

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// The pause's save copy may use twice mem_mib beyond the sandbox's memory, for the save only. Memory the copy
// writes into something the sandbox keeps (a memfd the interpreter made before the pause, inherited by the copy)
// must not stay outside the sandbox's limit once the save is over.
func TestSaveBudgetIsNotKeptThroughSharedMemory(t *testing.T) {
	s := testserver.Start(t, "--fork-ahead", "0")
	for _, c := range []struct {
		name, setup, write, check string
		template                  bool
	}{
		// A memfd the interpreter made before the pause: the copy inherits it.
		{"memfd", `held = os.memfd_create("held")`, `os.pwrite(held, chunk, i << 20)`,
			`os.fstat(held).st_size >> 20, os.pread(held, 1, (400 << 20) - 1)`, false},
		// A file on the sandbox's /dev/shm (a tmpfs), made by the copy itself.
		{"tmpfs", `held = "/dev/shm/held"`, `f.write(chunk)`,
			`os.stat(held).st_size >> 20, os.pread(os.open(held, os.O_RDONLY), 1, (400 << 20) - 1)`, false},
		// A template's capture, which leaves the sandbox running even when it succeeds.
		{"template", `held = os.memfd_create("held")`, `os.pwrite(held, chunk, i << 20)`,
			`os.fstat(held).st_size >> 20, os.pread(held, 1, (400 << 20) - 1)`, true},
	} {
		t.Run(c.name, func(t *testing.T) { saveKeepsMemory(t, s, c.setup, c.write, c.check, c.template) })
	}
}

// keptSandbox creates the sandbox of 256 MiB whose save copy will write 400 MiB, deleted at the test's end.
func keptSandbox(t *testing.T, ctx context.Context, s *testserver.Server) string {
	t.Helper()
	sb, err := s.Client.Create(ctx, client.CreateRequest{MemMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Client.Delete(context.Background(), sb.ID) }) //nolint:errcheck // the server's stop removes it anyway
	return sb.ID
}

// checkRestarted checks that sandbox id's processes were restarted for the memory its save kept, and that it says
// so: the next run_code fails saying why, it is running with pause.error naming the cause (a pause's: wantPause),
// and it runs code again.
func checkRestarted(t *testing.T, ctx context.Context, s *testserver.Server, id string, ex *client.Execution, wantPause ...string) {
	t.Helper()
	if ex.Error == nil || !strings.Contains(ex.Error.Value, "outside the sandbox's mem_mib") {
		t.Errorf("the run after the save: %+v %+v", ex.Value, ex.Error)
	}
	got, err := s.Client.Get(ctx, id)
	if err != nil || got.Status != client.StatusRunning {
		t.Errorf("the sandbox after the save: %+v %v", got, err)
	}
	for _, want := range wantPause {
		if got == nil || got.Pause == nil || !strings.Contains(got.Pause.Error, want) {
			t.Errorf("the sandbox's pause after the save: %+v, want its error to say %q", got, want)
		}
	}
	if v, err := s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: "1 + 1"}); err != nil || v.Value == nil || *v.Value != "2" {
		t.Errorf("the restarted sandbox runs code: %+v %v", v, err)
	}
}

// fillerCode is a session whose save writes 400 MiB into held with write (setup makes held: a memfd, or a path
// that write's f is opened on), then runs then (exit, wait, pass) before its __reduce__ returns.
func fillerCode(setup, write, then string) string {
	return `import os, time
` + setup + `
class Filler:
    def __reduce__(self):
        chunk = b"\x01" * (1 << 20)
        f = open(held, "wb") if isinstance(held, str) else None
        for i in range(400):
            ` + write + `
        if f:
            f.close()
        ` + then + `
        return (Filler, ())
filler = Filler()
1`
}

// memoryUsage is what a cgroup v1 memory directory counts, in bytes (0 if it cannot be read).
func memoryUsage(dir string) int64 {
	b, _ := os.ReadFile(dir + "/memory.usage_in_bytes")
	u, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return u
}

func saveKeepsMemory(t *testing.T, s *testserver.Server, setup, write, check string, template bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := keptSandbox(t, ctx, s)
	// The copy writes 400 MiB (within its 512 MiB budget, past the sandbox's 256), then exits: the pause fails
	// and the sandbox runs on.
	ex, err := s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: fillerCode(setup, write,
		map[bool]string{true: "pass", false: "os._exit(3)"}[template])})
	if err != nil || ex.Error != nil {
		t.Fatalf("setup: %v %+v", err, ex)
	}
	if template {
		name := "kept-" + id[4:12]
		if _, err := s.Client.SaveTemplate(ctx, name, id); err == nil {
			defer s.Client.DeleteTemplate(context.Background(), name) //nolint:errcheck // removed with the server's data
		}
	} else {
		if _, _, err := s.Client.Pause(ctx, id); err != nil {
			t.Fatal(err)
		}
		got, err := s.Client.WaitStatus(ctx, id, client.StatusPaused)
		if got == nil || got.Status != client.StatusRunning {
			t.Fatalf("a pause whose copy exits: %+v, %v; want it failed, the sandbox running", got, err)
		}
	}
	ex, err = s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: check})
	if err != nil {
		t.Fatal(err)
	}
	u := memoryUsage("/sys/fs/cgroup/memory/ramify/" + s.Owner() + "/" + id)
	if ex.Error == nil && ex.Value != nil && *ex.Value == `(400, b'\x01')` && u < 256<<20 {
		t.Fatalf("the sandbox keeps 400 MiB its save copy wrote while its own cgroup counts %d MiB of its 256", u>>20)
	}
	// It was restarted, and says so: its state is lost, its files kept.
	var wantPause []string
	if !template {
		wantPause = []string{"outside its mem_mib"}
	}
	checkRestarted(t, ctx, s, id, ex, wantPause...)
	if res, err := s.Client.Exec(ctx, id, client.ExecRequest{Cmd: "ls /dev/shm"}); err != nil || strings.Contains(res.Stdout, "held") {
		t.Errorf("/dev/shm after the restart: %+v %v", res, err)
	}
}

// The same across a restart: a server killed while a pause's save copy runs leaves the copy's cgroup behind, and
// what the copy wrote into memory the sandbox keeps (a memfd the interpreter made before the pause) must not stay
// outside the sandbox's limit once the next server start has removed that cgroup. The start finds it (the reclaim
// scan) and restarts the sandbox's processes, as after a save that ended.
func TestSaveBudgetIsNotKeptAcrossARestart(t *testing.T) {
	s := testserver.Start(t, "--fork-ahead", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := keptSandbox(t, ctx, s)
	// The copy writes 400 MiB into the memfd (within its 512 MiB budget, past the sandbox's 256), then waits.
	ex, err := s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: fillerCode(`held = os.memfd_create("held")`,
		`os.pwrite(held, chunk, i << 20)`, "time.sleep(120)")})
	if err != nil || ex.Error != nil {
		t.Fatalf("setup: %v %+v", err, ex)
	}
	memory := "/sys/fs/cgroup/memory/ramify/" + s.Owner()
	save := memory + "/" + id + "-save"
	if _, _, err := s.Client.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); memoryUsage(save) < 400<<20; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the save copy did not write its 400 MiB (cgroup %s: %d MiB)", save, memoryUsage(save)>>20)
		}
	}
	// The server dies while the copy saves: the 400 MiB stay charged to its cgroup, held by the interpreter.
	s.Kill()
	before := memoryUsage(memory)
	s.Restart()
	if _, err := os.Stat(save); !os.IsNotExist(err) {
		t.Errorf("the save copy's cgroup after the restart: %v", err)
	}
	if after := memoryUsage(memory); after > before-300<<20 {
		t.Errorf("the server's cgroups hold %d MiB after the restart, %d MiB before it: the 400 MiB the copy wrote were kept",
			after>>20, before>>20)
	}
	ex, err = s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: `os.fstat(held).st_size >> 20`})
	if err != nil {
		t.Fatal(err)
	}
	// It was restarted, and says so: its state is lost, its files kept.
	checkRestarted(t, ctx, s, id, ex, "server restart", "outside its mem_mib")
}
