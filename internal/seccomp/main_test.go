//go:build linux

package seccomp

import (
	"bufio"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary act as the `ramify __exec`-like helper of the integration test: install the
// filter on the main thread, print the listener fd, read "name=value" environment lines up to an empty line from
// stdin, then exec the command in helperArgvEnv (separated by \x1f).
const (
	helperEnv     = "RAMIFY_SECCOMP_TEST_HELPER"
	helperArgvEnv = "RAMIFY_SECCOMP_TEST_ARGV"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		helperMain()
		return
	}
	os.Exit(m.Run())
}

func helperMain() {
	// Nothing on this thread may send a signal (trapped) before the supervisor has the listener.
	debug.SetGCPercent(-1)
	runtime.LockOSThread()
	fd, err := InstallOnThisThread()
	if err != nil {
		os.Stdout.WriteString("error " + err.Error() + "\n")
		os.Exit(2)
	}
	os.Stdout.WriteString("fd " + strconv.Itoa(fd) + "\n")
	env := os.Environ()
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadString('\n')
		line = strings.TrimSuffix(line, "\n")
		if err != nil || line == "" {
			break
		}
		env = append(env, line)
	}
	argv := strings.Split(os.Getenv(helperArgvEnv), "\x1f")
	err = unix.Exec(argv[0], argv, env)
	os.Stdout.WriteString("error exec: " + err.Error() + "\n")
	os.Exit(2)
}
