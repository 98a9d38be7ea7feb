package security

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// The pause's save copy runs the sandbox's own code (an object's __reduce__) in a memory cgroup of its own,
// outside the sandbox's memory limit, and the server kills what is left there when the save ends. Processes
// that the copy starts and that hop from pid to pid (fork, parent exits) must not outrun that kill: one that
// did kept the save cgroup (twice mem_mib, beyond the sandbox's limit) for as long as the sandbox lived, and
// the cgroup was left behind.
func TestSaveCopyLeavesNothingBehind(t *testing.T) {
	s := testserver.Start(t, "--fork-ahead", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := s.Client.Create(ctx, client.CreateRequest{MemMiB: 256, VCPU: 2})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	defer s.Client.Delete(context.Background(), id) //nolint:errcheck // the server's stop removes it anyway
	// The copy starts hoppers (in its cgroup), waits until they run, then exits: the pause fails and the sandbox
	// runs on.
	ex, err := s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: `import os, subprocess, sys, time
import base64
HOP = base64.b64decode("f0VMRgIBAQAAAAAAAAAAAAIAPgABAAAAsABAAAAAAABAAAAAAAAAACgBAAAAAAAAAAAAAEAAOAACAEAABAADAAEAAAAFAAAAsAAAAAAAAACwAEAAAAAAALAAQAAAAAAANwAAAAAAAAA3AAAAAAAAAAEAAAAAAAAAUeV0ZAYAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAC6KAAAAL45AAAAMf9IifAPBUiFwHQE/8p18r45AAAAMf+6PAAAAEiJ8A8FSIXAfvZIidAPBevvR0NDOiAoRGViaWFuIDEyLjIuMC0xNCtkZWIxMnUxKSAxMi4yLjAAAC5zaHN0cnRhYgAudGV4dAAuY29tbWVudAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAACwAAAAEAAAAGAAAAAAAAALAAQAAAAAAAsAAAAAAAAAA3AAAAAAAAAAAAAAAAAAAAAQAAAAAAAAAAAAAAAAAAABEAAAABAAAAMAAAAAAAAAAAAAAAAAAAAOcAAAAAAAAAJwAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAAQAAAAAAAAABAAAAAwAAAAAAAAAAAAAAAAAAAAAAAAAOAQAAAAAAABoAAAAAAAAAAAAAAAAAAAABAAAAAAAAAAAAAAAAAAAA")
class Hopper:
    def __reduce__(self):
        with open("/tmp/hop", "wb") as f:
            f.write(HOP)
        os.chmod("/tmp/hop", 0o755)
        subprocess.Popen(["/tmp/hop"])
        time.sleep(1.5)
        os._exit(3)
h = Hopper()
1`})
	if err != nil || ex.Error != nil {
		t.Fatalf("setup: %v %+v", err, ex)
	}
	pidsFile := "/sys/fs/cgroup/pids/ramify/" + s.Owner() + "/" + id + "/pids.current"
	before, err := os.ReadFile(pidsFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Client.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	got, err := s.Client.WaitStatus(ctx, id, client.StatusPaused)
	if got == nil || got.Status != client.StatusRunning {
		t.Fatalf("a pause whose copy exits: %+v, %v; want it failed, the sandbox running", got, err)
	}
	// Nothing the copy started runs on, in the sandbox or in a cgroup of the server's. Hoppers change pid all
	// the time, so they are counted by the sandbox's tasks count, not found by pid.
	time.Sleep(time.Second)
	tasks, err := os.ReadFile(pidsFile)
	if err != nil {
		t.Fatal(err)
	}
	n0, _ := strconv.Atoi(strings.TrimSpace(string(before)))
	if n, _ := strconv.Atoi(strings.TrimSpace(string(tasks))); n > n0+2 {
		t.Errorf("the sandbox runs %d tasks after the save, %d before: what its copy started survived it", n, n0)
	}
	if leftover, _ := filepath.Glob("/sys/fs/cgroup/memory/ramify/" + s.Owner() + "/*-save"); len(leftover) > 0 {
		t.Errorf("save cgroups left: %v", leftover)
	}
}
