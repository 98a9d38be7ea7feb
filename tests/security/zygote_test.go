package security

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/testserver"
)

// TestZygoteInterpreterKeepsNothingOfTheZygote: a sandbox created from a family started ahead gets that family's
// zygote interpreter itself (handed over, not forked). Once it is the sandbox's, it is in the sandbox's
// namespaces and cgroups only, holds no descriptor of the zygote's, and nothing of the zygote (its agent, its
// cgroups, its layer) is left; from inside, the sandbox sees its own files, host name and parent.
func TestZygoteInterpreterKeepsNothingOfTheZygote(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0", "--prestart-families", "1", "--fork-ahead", "0")
	zygotes := func() []string {
		var out []string
		for _, c := range s.Inventory().Cgroups {
			if strings.HasPrefix(c, "zyg_") {
				out = append(out, c)
			}
		}
		return out
	}
	// The family started ahead is ready once its spare sits in a cgroup of its own, the last step.
	var zyg string
	var zygPid int
	for deadline := time.Now().Add(30 * time.Second); zygPid == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no family started ahead with a zygote: %+v\n%s", s.Inventory(), s.Log())
		}
		spare := false
		for _, c := range s.Inventory().Cgroups {
			spare = spare || (strings.HasPrefix(c, "fam_p") && strings.Contains(c, ".s"))
		}
		if z := zygotes(); spare && len(z) == 1 {
			zyg = z[0]
			zygPid = interpreterPid(zyg)
		}
	}
	time.Sleep(400 * time.Millisecond) // added to the pool just after its spare is placed
	id := s.Create(t, nil)
	pid := interpreterPid(id)
	if pid != zygPid {
		t.Fatalf("the sandbox's interpreter is %d, not the zygote's %d (handed over): forked or started afresh?\n%s", pid, zygPid, s.Log())
	}
	agent := testserver.AgentPid(id)
	for _, ns := range []string{"mnt", "net", "uts", "ipc", "pid", "user"} {
		want, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", agent, ns))
		got, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err1 != nil || err2 != nil || got != want {
			t.Errorf("namespace %s: interpreter %s (%v), the sandbox's agent %s (%v)", ns, got, err2, want, err1)
		}
	}
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && strings.Contains(parts[2], "/ramify/") && !strings.HasSuffix(parts[2], "/"+id) {
			t.Errorf("the interpreter's cgroup in %q is %s, not the sandbox's", parts[1], parts[2])
		}
	}
	// The zygote's agent, cgroups and layer go once the sandbox runs (a next family's zygote, of another name, may
	// be starting already).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		inv := s.Inventory()
		if !slices.Contains(inv.Cgroups, zyg) && !slices.Contains(inv.Layers, zyg) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the zygote %s is left: %+v", zyg, inv)
		}
	}
	// Every file it holds is on a mount of the sandbox's own file system: a descriptor of the zygote's (stdin,
	// /dev/null as the zygote's agent opened it) is on a mount the sandbox does not have, and reads "/" once the
	// zygote's file system is gone.
	mountinfo, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	mounts := map[string]bool{}
	for _, line := range strings.Split(string(mountinfo), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			mounts[f[0]] = true
		}
	}
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	for _, fd := range fds {
		target, err := os.Readlink(fd)
		if err != nil || strings.HasPrefix(target, "socket:") || strings.HasPrefix(target, "pipe:") {
			continue
		}
		if target != "/dev/null" {
			t.Errorf("the interpreter holds %s -> %s", filepath.Base(fd), target)
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, filepath.Base(fd)))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(info), "\n") {
			if id, ok := strings.CutPrefix(line, "mnt_id:"); ok && !mounts[strings.TrimSpace(id)] {
				t.Errorf("the interpreter's fd %s (%s) is on mount %s, not one of the sandbox's", filepath.Base(fd), target, strings.TrimSpace(id))
			}
		}
	}
	// From inside: its own host name and files, nothing of the zygote's root; its parent is not an agent.
	got := s.Value(t, id, `import os, socket
open("/root/mine", "w").write("x")
ppid = os.getppid()
comm = open("/proc/%d/comm" % ppid).read().strip() if os.path.exists("/proc/%d/comm" % ppid) else "gone"
(socket.gethostname(), sorted(os.listdir("/root")), ppid, comm, os.getcwd())`)
	t.Logf("inside: %s", got)
	if !strings.Contains(got, "'mine'") || strings.Contains(got, "zyg") || !strings.HasSuffix(got, "'/root')") {
		t.Errorf("inside the sandbox: %s", got)
	}
	if strings.Contains(got, "ramify") {
		t.Errorf("the interpreter's parent is an agent (the zygote's, still alive?): %s", got)
	}
	if v := s.Value(t, id, "1 + 1"); v != "2" {
		t.Errorf("1 + 1 = %s", v)
	}
}

// interpreterPid is the host pid of the python3 interpreter in the cgroup named name (a sandbox's or a zygote's),
// or 0.
func interpreterPid(name string) int {
	for _, pid := range testserver.SandboxPids(name) {
		cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if strings.HasPrefix(string(cmd), "python3\x00-u\x00-c") {
			return pid
		}
	}
	return 0
}
