package agent

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/seccomp"
)

// UserCaps are the capabilities sandbox code holds: container root keeps what ordinary root work needs (files,
// ownership, users, binding low ports, chroot) and nothing that reaches the kernel's or other processes'
// internals. It is Docker's default set less CAP_NET_RAW (raw and packet sockets: spoofing, sniffing). Dropped,
// among others: CAP_SYS_PTRACE (with ramify's processes made non-dumpable, nothing in a sandbox can read or write
// their memory, descriptors or environment), CAP_SYS_BOOT (reboot(2) in a PID namespace would kill the family's
// init and every sandbox of the family), CAP_SYS_ADMIN (mount, namespaces, ...), CAP_NET_ADMIN (addresses, routes:
// no spoofing a neighbour's IP), CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_SYS_TIME, CAP_SYSLOG, CAP_BPF, CAP_PERFMON,
// CAP_SYS_NICE, CAP_IPC_LOCK, CAP_LINUX_IMMUTABLE, CAP_DAC_READ_SEARCH, CAP_CHECKPOINT_RESTORE.
var UserCaps = []int{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID, unix.CAP_KILL, unix.CAP_SETGID,
	unix.CAP_SETUID, unix.CAP_SETPCAP, unix.CAP_NET_BIND_SERVICE, unix.CAP_SYS_CHROOT, unix.CAP_SETFCAP,
	unix.CAP_MKNOD, unix.CAP_AUDIT_WRITE,
}

// interpreterExtraCaps are held by the interpreter process itself (effective, not in its bounding set, so no
// program it starts gets them): a forked interpreter joins its new sandbox's namespaces with setns(2), which needs
// CAP_SYS_ADMIN over them. setns is judged by the supervisor, and the default seccomp profile closes the other
// calls CAP_SYS_ADMIN would open (mount, unshare, ...).
var interpreterExtraCaps = []int{unix.CAP_SYS_ADMIN}

func capMask(caps ...[]int) uint64 {
	var m uint64
	for _, l := range caps {
		for _, c := range l {
			m |= 1 << uint(c)
		}
	}
	return m
}

// interpreterCapsEnv tells the interpreter (repl.py) which capabilities to keep: "<bounding mask>:<permitted
// mask>", in hex.
func interpreterCapsEnv() string {
	return "RAMIFY_CAPS=" + strconv.FormatUint(capMask(UserCaps), 16) + ":" +
		strconv.FormatUint(capMask(UserCaps, interpreterExtraCaps), 16)
}

// confineThread reduces the calling OS thread (locked by the caller) to what sandbox code may hold: the
// bounding, permitted and effective sets to keep (so every program it starts as root gets keep and no more), no
// inheritable or ambient capabilities, and no_new_privs (no set-uid or file-capability gain on exec).
func confineThread(keep uint64) error {
	last := lastCap() // a /proc read: once, not once per capability
	for c := 0; c <= last; c++ {
		if keep&(1<<uint(c)) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for i := range data {
		k := uint32(keep >> (32 * i))
		data[i].Permitted &= k
		data[i].Effective &= k
		data[i].Inheritable = 0
	}
	if err := capset(&hdr, &data); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	return nil
}

// sandboxGID is the group every process of this agent's sandbox runs with: seccomp.SandboxGIDBase plus the
// agent's pid in the family's PID namespace, unique among the family's live sandboxes. Fork siblings share a
// uid; with a group of their own, the kernel's same-credentials rule no longer lets one open another's
// /proc/<pid>/mem, environ, fd or root, ptrace it, or see it in a /proc mounted with hidepid (see stageRoot),
// and the seccomp supervisor lets no process take another sandbox's group.
func sandboxGID() int { return SandboxGID(os.Getpid()) }

// SandboxGID is the group of the sandbox whose agent has pid agentNsPid in the family's PID namespace.
func SandboxGID(agentNsPid int) int { return seccomp.SandboxGIDBase + agentNsPid }

// sandboxGroups are the supplementary groups of sandbox processes: root's group, as root has outside ramify
// (the kernel's ptrace check looks at the primary ids only).
var sandboxGroups = []uint32{0}

// joinSandboxGroup gives the calling OS thread (locked by the caller) the sandbox's group as its real,
// effective and saved gid, and root's group as its only supplementary one. Raw calls: Go's wrappers would
// change every thread of the agent.
func joinSandboxGroup() error {
	g := uintptr(sandboxGID())
	groups := sandboxGroups
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(unsafe.Pointer(&groups[0])), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, g, g, g); e != 0 {
		return fmt.Errorf("setresgid %d: %w", g, e)
	}
	return nil
}

// capset calls capset(2) for the calling thread only (unix.Capset would do the same; the raw call makes the
// per-thread effect explicit: Go's syscall.AllThreadsSyscall is not what is wanted here).
func capset(hdr *unix.CapUserHeader, data *[2]unix.CapUserData) error {
	_, _, errno := unix.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func lastCap() int {
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return n
		}
	}
	return unix.CAP_LAST_CAP
}

// HardenSelf is the first thing the family init and every agent do: they run next to sandbox code and are the
// most valuable target in a sandbox.
//   - not dumpable (they are exec'd from a file they cannot read, which already makes them so; this says it
//     again should they ever be started another way): no /proc/<pid>/mem, fd, environ or root, no ptrace, no
//     pidfd_getfd for anything without CAP_SYS_PTRACE over them;
//   - no descriptor inherited by accident: everything from firstFD up is marked close-on-exec, so nothing the
//     server's own launcher left open reaches a sandbox;
//   - SIGPIPE ignored: their stdout and stderr are a pipe to the server, which may be gone (a restart); they lose
//     log lines then, not their life.
func HardenSelf(firstFD int) error {
	signal.Ignore(syscall.SIGPIPE)
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("not dumpable: %w", err)
	}
	if err := unix.CloseRange(uint(firstFD), ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("close inherited descriptors: %w", err)
	}
	return nil
}
