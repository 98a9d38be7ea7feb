// Package seccomp polices the process-targeting syscalls of sandboxes that share one PID namespace.
//
// Sandboxes of one fork family share a user namespace and a PID namespace and all run as root in that user namespace,
// so without help any of them could signal, trace, or join the namespaces of a sibling's processes. This package owns
// the mechanism that prevents it (see /work/shared/PLATFORM-NOTES.md, "Policing a shared PID namespace"):
//
//   - [Program] / [ProgramBytes]: a classic-BPF seccomp filter that returns SECCOMP_RET_USER_NOTIF for the rare
//     process-targeting syscalls (kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_open,
//     pidfd_send_signal, pidfd_getfd, ptrace, process_vm_readv, process_vm_writev, process_madvise, kcmp, setns) and,
//     for everything else, the default syscall profile of policy.go (an allow-list; EPERM for what it closes).
//     Compiled ahead into program_amd64.bin (TestEmbeddedProgramIsCurrent keeps it equal to the policy; its -update
//     flag rewrites it): a process that installs the filter does not build it.
//   - [InstallOnThisThread]: installs that filter on the calling thread with SECCOMP_FILTER_FLAG_NEW_LISTENER (used by
//     `ramify __exec` right before it execs the user's command).
//   - [Supervisor]: answers the notifications. A call is allowed only when its target is in the caller's own sandbox,
//     which is decided by comparing cgroups: the `pids` controller line of /proc/<pid>/cgroup on cgroup v1, the `0::`
//     line on v2, else the whole file.
//
// # Architectures
//
// Only x86_64 is supported. The filter checks seccomp_data.arch:
//   - AUDIT_ARCH_X86_64 with the x32 bit (nr >= 0x40000000): SECCOMP_RET_ERRNO(ENOSYS) for every syscall, which is what
//     a kernel built without x32 support answers (x32 numbers differ and are not worth policing).
//   - AUDIT_ARCH_I386 (32-bit binaries, or int 0x80 from 64-bit code): the i386 numbers of the listed syscalls are
//     trapped to the supervisor too, which maps them to the same decisions (arguments are truncated to 32 bits, as the
//     kernel does). Emulations that would need to read 32-bit structures from the caller's memory
//     (pidfd_send_signal with a siginfo) answer EPERM for i386 callers.
//   - any other architecture: SECCOMP_RET_KILL_PROCESS (unreachable on an x86_64 kernel).
//
// # Decisions
//
// A refused call fails with EPERM. When the target does not exist, or the arguments are such that the kernel would
// fail the call without any effect, the supervisor answers what the kernel would (ESRCH, EINVAL, EBADF). Anything it
// cannot read or parse fails closed with EPERM. Before it answers SECCOMP_USER_NOTIF_FLAG_CONTINUE or acts on the
// caller's behalf, it checks SECCOMP_IOCTL_NOTIF_ID_VALID, so that /proc data read for a caller whose tid was reused
// is never acted upon.
//
//   - kill / tkill / rt_sigqueueinfo with pid > 0, tgkill / rt_tgsigqueueinfo, ptrace (except PTRACE_TRACEME, always
//     allowed), process_vm_readv / process_vm_writev, pidfd_open, kcmp (both pids): CONTINUE when every target is in
//     the caller's sandbox.
//   - kill(0), kill(-1), kill(-pgrp) are emulated: the supervisor signals, through pidfds (no pid reuse), each process
//     of the caller's sandbox that the call designates (its process group; for -1 every process except pid 1 and the
//     caller's thread group) and answers 0, or ESRCH when none matched. The caller itself is signalled last, before
//     the answer; the filter is installed with SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV ([FilterFlags]) so that this
//     signal stays pending until the call returns instead of interrupting (and restarting) it. Emulated signals carry
//     the supervisor's pid in si_pid. rt_sigqueueinfo with pid <= 0 answers ESRCH, as the kernel does.
//   - pidfd_send_signal with PIDFD_SIGNAL_PROCESS_GROUP is refused (EPERM): the group may hold siblings' processes.
//   - pidfd_send_signal and pidfd_getfd are emulated: the supervisor copies the caller's fd with pidfd_getfd, reads the
//     target pid from its own fdinfo, and performs the call on its copy (pidfd_getfd's result is installed in the
//     caller with SECCOMP_IOCTL_NOTIF_ADDFD). Acting on a copy closes the race in which another thread of the caller
//     swaps the fd (dup2) between the check and the kernel's use of it. Only real pidfds are accepted: a /proc/<pid>
//     directory fd given to pidfd_send_signal is refused with EPERM. The PIDFD_SELF_* sentinels are allowed.
//   - sched_setaffinity, sched_setparam, sched_setscheduler, sched_setattr (pid in args[0]), setpriority and
//     ioprio_set (which = a process, pid in args[1]) reach the supervisor only when aimed at another process:
//     CONTINUE when it is in the caller's sandbox (the kernel checks the uid only, which fork siblings share).
//   - setgid, setregid, setresgid, setfsgid (and their i386 forms) reach the supervisor only when they name a
//     sandbox group ([SandboxGIDBase] up): CONTINUE when it is the caller's own sandbox's (SandboxGIDBase plus the
//     pid of the agent in the caller's sandbox, a protected process), else EPERM.
//   - process_madvise(pidfd) and setns(fd) are judged through /proc/<caller>/fdinfo/<fd> and /proc/<caller>/fd/<fd>
//     and then continued. setns with a pidfd judges its process; setns with a namespace file is allowed only when some
//     process of the caller's sandbox is in that namespace (so namespaces the sandbox created pass, a sibling's do
//     not; a namespace kept alive only by a bind mount is refused).
//
// # Known limits
//
//   - For CONTINUEd calls the kernel re-resolves pids and fds after the check. A pid can only be reused by a sibling if
//     the target dies and the pid space wraps around within that window. An fd can be swapped by another thread
//     sharing the caller's fd table; this leaves process_madvise (performance advice only: MADV_COLD, MADV_PAGEOUT,
//     MADV_WILLNEED, MADV_COLLAPSE) and setns open to a racing multi-threaded caller. setns cannot be emulated.
//   - /proc/<pid>/mem, /proc/<pid>/root, /proc/<pid>/cwd and /proc/<pid>/fd of a sibling stay reachable to root in the
//     family through the filesystem; this package does not police them.
//   - A trapped call whose notification is still queued (not yet received by the supervisor) is interrupted by a
//     signal like any slow syscall: it restarts, or fails with EINTR when the handler lacks SA_RESTART. kill(2) never
//     does that natively; the window is the supervisor's reaction time (tens of microseconds).
//   - A process that already runs under a filter with a listener cannot get another one (the kernel answers EBUSY), so
//     the agent that serves the notifications must not itself be filtered.
package seccomp
