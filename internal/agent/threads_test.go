package agent

import (
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func threadsNow(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// After reserveThreads(n), n goroutines blocked in system calls at once start no thread: the agent's threads
// were all made while its sandbox's tasks limit had room (threads.go).
func TestReserveThreadsCoversBlockingCalls(t *testing.T) {
	defer goruntime.GOMAXPROCS(goruntime.GOMAXPROCS(1)) // as the agent runs
	const n = 6
	before := threadsNow(t)
	reserveThreads(n)
	reserved := threadsNow(t)
	if reserved < n+2 { // n locked at once, one running the caller, sysmon
		t.Fatalf("%d threads after reserveThreads(%d) (%d before)", reserved, n, before)
	}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ts := unix.NsecToTimespec(int64(100 * time.Millisecond))
			unix.Nanosleep(&ts, nil) //nolint:errcheck // a system call that blocks its thread
		}()
	}
	time.Sleep(50 * time.Millisecond)
	during := threadsNow(t)
	wg.Wait()
	// One thread of slack: the runtime, or a goroutine an earlier test of the package left, may start one of its
	// own meanwhile (CI saw 10 -> 11 once, on a loaded machine); without the reservation the n blocked
	// goroutines start n-1 or n.
	if during > reserved+1 {
		t.Errorf("%d goroutines blocked in system calls started threads: %d -> %d", n, reserved, during)
	}
}

// waitidNr is waitid(2)'s number, by architecture.
var waitidNr = map[string]string{"amd64": "247", "arm64": "95"}

// threadsInWaitid counts this process's threads blocked in waitid(2) now.
func threadsInWaitid(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/syscall")
		if err == nil && strings.Fields(string(b))[0] == waitidNr[goruntime.GOARCH] {
			n++
		}
	}
	return n
}

// waitExit holds no thread while the command runs, where cmd.Wait holds one per command (blocked in waitid); and
// it returns the command's exit status as cmd.Wait does.
func TestWaitExitHoldsNoThread(t *testing.T) {
	if waitidNr[goruntime.GOARCH] == "" {
		t.Skip("waitid's number on", goruntime.GOARCH, "is not listed")
	}
	const n = 8
	blocked := func(waiter func(*exec.Cmd) error) int {
		var wg sync.WaitGroup
		for range n {
			c := exec.Command("sleep", "1.5")
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := waiter(c); err != nil {
					t.Errorf("wait: %v", err)
				}
			}()
		}
		defer wg.Wait()
		// Every waiter has had ample time to block (the commands run for 1.5 s): count them.
		time.Sleep(500 * time.Millisecond)
		return threadsInWaitid(t)
	}
	if got := blocked(waitExit); got != 0 {
		t.Errorf("waitExit of %d running commands: %d threads blocked in waitid", n, got)
	}
	if got := blocked((*exec.Cmd).Wait); got != n { // the measure itself: what waitExit avoids
		t.Errorf("cmd.Wait of %d running commands: %d threads blocked in waitid", n, got)
	}
	c := exec.Command("sh", "-c", "exit 3")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(c); c.ProcessState == nil || c.ProcessState.ExitCode() != 3 || err == nil {
		t.Errorf("waitExit of exit 3: %v, %v", err, c.ProcessState)
	}
}
