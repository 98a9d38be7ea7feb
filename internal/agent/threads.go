package agent

import (
	"os"
	"os/exec"
	goruntime "runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// An agent's OS threads count against its sandbox's tasks limit (max_procs), and the Go runtime ends the whole
// process when it needs a thread and cannot start one ("failed to create new OS thread", errno EAGAIN). Code
// that fills the limit (a fork bomb, a process pool larger than max_procs) then killed the agent the moment
// it needed one more thread: a command's exit waited for in a blocking system call, a slow read while a call
// came in. The sandbox was restarted, its interpreter's state lost. So the agent takes every thread it will
// need as it starts, while the limit has room, and never asks for another:
//   - reserveThreads starts ReservedThreads threads and leaves them idle; the Go runtime keeps idle threads for
//     good and hands them a goroutine whose system call blocks, before it would start a new one;
//   - no goroutine holds a thread for long in a blocking call: a process's exit is awaited through a pidfd in
//     the runtime's poller (waitExit), as sockets and pipes already are.
// The sandbox's tasks limit is max_procs plus Tasks, so the agent's threads do not eat into what the sandbox
// asked for.

// ReservedThreads is how many idle threads an agent keeps for system calls that block (more than one at once
// only when the host is so loaded that short calls take long).
const ReservedThreads = 8

// Tasks is the most tasks (threads) an agent has: the runtime's own (main, sysmon, the template thread for
// locked goroutines, signals), the spawner and the seccomp supervisor, which keep a thread each, the reserve,
// and a margin. The runtime adds it to each sandbox's tasks limit.
const Tasks = 24

// reserveThreads has the Go runtime start n threads beyond those it runs now, then leaves them idle. Each of n
// goroutines locks itself to a thread and waits: a locked goroutine's thread cannot run anything else, so the
// runtime starts another for the rest. Once all n are waiting they unlock and end, and their threads stay,
// idle (the runtime does not end idle threads; one whose goroutine ends while locked would end with it).
func reserveThreads(n int) {
	var locked, done sync.WaitGroup
	release := make(chan struct{})
	locked.Add(n)
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			goruntime.LockOSThread()
			locked.Done()
			<-release
			goruntime.UnlockOSThread()
		}()
	}
	locked.Wait()
	close(release)
	done.Wait()
}

// waitExit waits for cmd's process to exit, then reaps it (cmd.Wait). The wait itself is on a pidfd in the
// runtime's poller, which holds no thread: Process.Wait blocks a thread in waitid for as long as the command runs,
// and a command started while the tasks limit was nearly full could then not be waited for. Where pidfds are
// not available the wait is cmd.Wait's own.
func waitExit(cmd *exec.Cmd) error {
	fd, err := unix.PidfdOpen(cmd.Process.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return cmd.Wait()
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	if rc, err := f.SyscallConn(); err == nil {
		// A pidfd is readable once its process has exited; Read calls exited again each time the poller says so.
		rc.Read(func(fd uintptr) bool { //nolint:errcheck // on an error cmd.Wait below waits as it would have
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return err != nil && err != unix.EINTR || n > 0
		})
	}
	f.Close()
	return cmd.Wait()
}
