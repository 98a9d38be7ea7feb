package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// killSandboxProcesses SIGKILLs, from the host, every process in the sandbox's cgroup (its agent and
// interpreter): a stand-in for an out-of-band failure while the server is down.
func killSandboxProcesses(id string) error {
	files, _ := filepath.Glob("/sys/fs/cgroup/*/ramify/*/" + id + "/cgroup.procs")
	more, _ := filepath.Glob("/sys/fs/cgroup/ramify/*/" + id + "/cgroup.procs")
	n := 0
	for _, f := range append(files, more...) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, p := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(p)
			if pid > 0 && syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
	}
	if n == 0 {
		return fmt.Errorf("no process of %s found", id)
	}
	return nil
}
