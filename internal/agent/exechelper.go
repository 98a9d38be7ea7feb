package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"runtime/debug"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/seccomp"
)

// ExecMain is `ramify __exec -- argv...`: the agent runs every command through it. It installs the sandbox's
// seccomp filter on its own thread, hands the filter's listener to the agent over fd 3, and executes argv (the
// filter survives execve). It exits 127 when argv[0] cannot be found, 126 when it cannot be executed.
func ExecMain(args []string) error {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		return errors.New("__exec: missing command")
	}
	debug.SetGCPercent(-1) // nothing between the filter and execve should need another thread's help
	goruntime.LockOSThread()
	lfd, err := seccomp.InstallOnThisThread()
	if err != nil {
		return fmt.Errorf("__exec: %w", err)
	}
	if err := unix.Sendmsg(3, []byte("listener"), unix.UnixRights(lfd), nil, 0); err != nil {
		return fmt.Errorf("__exec: hand the seccomp listener to the agent: %w", err)
	}
	unix.Close(lfd)
	unix.Close(3)
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: command not found\n", args[0])
		os.Exit(127)
	}
	err = syscall.Exec(path, args, os.Environ())
	fmt.Fprintf(os.Stderr, "%s: %v\n", args[0], err)
	if errors.Is(err, syscall.ENOENT) {
		os.Exit(127)
	}
	os.Exit(126)
	return nil
}
