//go:build linux

package seccomp

import (
	"fmt"
	"sort"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The default syscall profile of every sandbox process, modelled on the default profiles container runtimes ship
// (moby's profiles/seccomp/default.json, containerd's contrib/seccomp/seccomp_default.go) for a container without
// CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_SYS_BOOT, CAP_SYS_MODULE, CAP_SYS_TIME, CAP_SYSLOG, CAP_BPF or CAP_PERFMON:
// an allow-list. A syscall that is not listed fails with EPERM, so a syscall added to a future kernel stays
// closed until it is looked at. Exceptions:
//   - the process-targeting syscalls of [syscallsX8664] go to the supervisor (SECCOMP_RET_USER_NOTIF), as before;
//   - clone3 fails with ENOSYS: its flags live in memory the filter cannot read, and glibc (and Go) fall back to
//     clone, whose flags the filter checks (Docker does the same);
//   - clone, unshare, socket, socketcall, personality and prlimit64 are allowed for some arguments only, and the
//     group-id and scheduling calls go to the supervisor for some ([argRules]); every argument checked is an int (or a flags word the kernel truncates to 32 bits), so the
//     filter compares the low 32 bits, which is what the kernel uses (a high word cannot hide a value); the one
//     pointer checked, prlimit64's new_limit, is compared whole.
// The profile is the same for exec'd commands and the interpreter. The interpreter holds CAP_SYS_ADMIN (for a
// fork child's setns); this profile is what keeps that capability from opening mount, unshare and the rest.

// group is a set of syscalls with the reason they are open or closed.
type group struct {
	why   string
	names []string
}

// allowGroups are allowed whatever their arguments (the kernel caches that verdict per syscall number, so they
// cost nothing after the first call). Names an architecture lacks are skipped there.
var allowGroups = []group{
	{"files, directories and descriptors: ordinary work; they act within the sandbox's own mount namespace and " +
		"its overlay, under its user namespace's permissions", []string{
		"read", "write", "open", "openat", "openat2", "creat", "close", "close_range", "lseek", "_llseek",
		"pread64", "pwrite64", "readv", "writev", "preadv", "pwritev", "preadv2", "pwritev2",
		"stat", "fstat", "lstat", "newfstatat", "statx", "stat64", "fstat64", "lstat64", "fstatat64",
		"statfs", "fstatfs", "statfs64", "fstatfs64", "access", "faccessat", "faccessat2",
		"dup", "dup2", "dup3", "fcntl", "fcntl64", "flock", "ioctl",
		"fsync", "fdatasync", "sync", "syncfs", "sync_file_range", "truncate", "ftruncate", "truncate64",
		"ftruncate64", "fallocate", "fadvise64", "fadvise64_64", "readahead", "cachestat",
		"getdents", "getdents64", "getcwd", "chdir", "fchdir", "rename", "renameat", "renameat2",
		"mkdir", "mkdirat", "rmdir", "link", "linkat", "unlink", "unlinkat", "symlink", "symlinkat",
		"readlink", "readlinkat", "chmod", "fchmod", "fchmodat", "fchmodat2",
		"chown", "fchown", "lchown", "fchownat", "chown32", "fchown32", "lchown32", "umask",
		"utime", "utimes", "utimensat", "utimensat_time64", "futimesat", "mknod", "mknodat",
		"copy_file_range", "sendfile", "sendfile64", "splice", "tee", "vmsplice", "name_to_handle_at",
		"getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr", "setxattr", "lsetxattr",
		"fsetxattr", "removexattr", "lremovexattr", "fremovexattr", "getxattrat", "setxattrat", "listxattrat",
		"removexattrat", "file_getattr", "file_setattr",
		"inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_mark",
	}},
	{"chroot: sandbox root holds CAP_SYS_CHROOT (Docker's default); a chroot inside the sandbox's own root " +
		"reaches nothing outside it", []string{"chroot"}},
	{"memory of the caller itself: allocation, protection, locking (bounded by RLIMIT_MEMLOCK and the cgroup), " +
		"NUMA policy of its own pages (migrating another process's pages, migrate_pages and move_pages, stays " +
		"closed)", []string{
		"brk", "mmap", "mmap2", "munmap", "mremap", "mprotect", "madvise", "mincore", "msync",
		"mlock", "mlock2", "mlockall", "munlock", "munlockall", "remap_file_pages", "memfd_create", "memfd_secret",
		"membarrier", "pkey_alloc", "pkey_free", "pkey_mprotect", "mseal", "map_shadow_stack",
		"get_mempolicy", "set_mempolicy", "mbind", "set_mempolicy_home_node",
	}},
	{"processes and threads: creating them (clone is argument-checked), running programs, waiting, identity " +
		"within the user namespace, scheduling and resource limits of one's own processes (the cgroup bounds " +
		"them), thread-local storage, self-restriction (prctl, seccomp, landlock)", []string{
		"fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "waitpid",
		"set_tid_address", "set_robust_list", "get_robust_list", "rseq", "restart_syscall",
		"arch_prctl", "set_thread_area", "get_thread_area", "modify_ldt", "prctl", "seccomp", "capget", "capset",
		"getpid", "getppid", "gettid", "getpgid", "setpgid", "getpgrp", "getsid", "setsid",
		"getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups",
		"getuid32", "geteuid32", "getgid32", "getegid32", "getresuid32", "getresgid32", "getgroups32",
		"setuid", "setreuid", "setresuid", "setfsuid", "setgroups",
		"setuid32", "setreuid32", "setresuid32", "setfsuid32", "setgroups32",
		"getpriority", "sched_yield", "sched_getaffinity", "sched_getparam", "sched_getscheduler",
		"sched_get_priority_max", "sched_get_priority_min", "sched_rr_get_interval", "sched_rr_get_interval_time64",
		"sched_getattr", "ioprio_get",
		"getrlimit", "setrlimit", "ugetrlimit", "getrusage", "times", "sysinfo", "uname", "getcpu",
		"process_mrelease", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
		"lsm_get_self_attr", "lsm_list_modules",
	}},
	{"signals of the caller itself (sending to another process is judged by the supervisor)", []string{
		"rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigsuspend", "rt_sigtimedwait",
		"rt_sigtimedwait_time64", "sigaltstack", "signalfd", "signalfd4", "sigreturn", "sigprocmask", "sigaction",
		"sigsuspend", "sigpending", "pause", "alarm",
	}},
	{"reading clocks, sleeping, timers (setting the clock is closed)", []string{
		"clock_gettime", "clock_gettime64", "clock_getres", "clock_getres_time64", "clock_nanosleep",
		"clock_nanosleep_time64", "gettimeofday", "time", "nanosleep", "getitimer", "setitimer",
		"timer_create", "timer_settime", "timer_settime64", "timer_gettime", "timer_gettime64",
		"timer_getoverrun", "timer_delete", "timerfd_create", "timerfd_settime", "timerfd_settime64",
		"timerfd_gettime", "timerfd_gettime64",
	}},
	{"waiting, events, pipes, futexes, randomness", []string{
		"poll", "ppoll", "ppoll_time64", "select", "_newselect", "pselect6", "pselect6_time64",
		"epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2",
		"epoll_ctl_old", "epoll_wait_old", "eventfd", "eventfd2", "pipe", "pipe2",
		"futex", "futex_time64", "futex_waitv", "futex_wake", "futex_wait", "futex_requeue", "getrandom",
	}},
	{"System V and POSIX IPC: the sandbox has its own IPC namespace", []string{
		"ipc", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop", "semtimedop_time64",
		"semctl", "shmget", "shmat", "shmdt", "shmctl", "mq_open", "mq_unlink", "mq_timedsend",
		"mq_timedsend_time64", "mq_timedreceive", "mq_timedreceive_time64", "mq_notify", "mq_getsetattr",
	}},
	{"sockets once created (which families and types may be created is checked on socket()); the sandbox has " +
		"its own network namespace", []string{
		"socketpair", "bind", "connect", "listen", "accept", "accept4", "getsockname", "getpeername",
		"sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "recvmmsg_time64", "shutdown",
		"setsockopt", "getsockopt",
	}},
	{"asynchronous I/O (Linux AIO, which runs in the caller's context and is filtered; io_uring is not)", []string{
		"io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
		"io_pgetevents_time64",
	}},
}

// closedGroups document what the profile closes and why; they are refused (EPERM) like everything unlisted, and
// the tests check each name against the program.
var closedGroups = []group{
	{"kernel keyrings: not namespaced, keys and quotas are per host uid (one sandbox could exhaust another's " +
		"quota), a long history of kernel bugs", []string{"add_key", "request_key", "keyctl"}},
	{"kernel programs and performance counters: bpf, perf_event_open (side channels, kernel bugs)",
		[]string{"bpf", "perf_event_open"}},
	{"userfaultfd: lets a process stall the kernel mid-copy, the usual tool to win kernel races",
		[]string{"userfaultfd"}},
	{"io_uring: runs I/O in kernel workers the seccomp filter never sees, and has a long history of kernel " +
		"bugs (Docker closed it in 2023)", []string{"io_uring_setup", "io_uring_enter", "io_uring_register"}},
	{"mounts and the mount API: the sandbox's file system layout, masked and read-only paths are ramify's; " +
		"statmount, listmount and listns would list namespaces and mounts beyond the sandbox's own", []string{
		"mount", "umount", "umount2", "pivot_root", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
		"open_tree", "open_tree_attr", "mount_setattr", "statmount", "listmount", "listns"}},
	{"kernel images and modules", []string{"kexec_load", "kexec_file_load", "init_module", "finit_module",
		"delete_module", "create_module", "query_module", "get_kernel_syms"}},
	{"setting the clock: the clocks are the host's", []string{"clock_settime", "clock_settime64",
		"clock_adjtime", "clock_adjtime64", "settimeofday", "adjtimex", "stime"}},
	{"the machine: reboot (in a PID namespace it kills the family's init), swap, process accounting, quotas, " +
		"the kernel log, the terminal hang-up, the host and domain name (set by ramify)", []string{
		"reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup", "sethostname",
		"setdomainname"}},
	{"file handles and obsolete kernel interfaces: open_by_handle_at opens any inode of a file system by " +
		"number, past the mount namespace (the 'shocker' escape)", []string{"open_by_handle_at",
		"lookup_dcookie", "nfsservctl", "fanotify_init", "_sysctl", "sysfs", "ustat", "uselib", "bdflush"}},
	{"x86 hardware access and virtual 8086 mode", []string{"iopl", "ioperm", "vm86", "vm86old"}},
	{"moving another process's memory between NUMA nodes", []string{"migrate_pages", "move_pages"}},
}

// noSysNames fail with ENOSYS, so that callers fall back to an older syscall the filter can judge.
var noSysNames = []string{"clone3"}

// Namespace flags of clone(2) and unshare(2). CLONE_NEWTIME (0x80) is the exit-signal field in clone's flags,
// so only unshare can ask for it.
const (
	cloneNSFlags   = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP
	unshareNSFlags = cloneNSFlags | unix.CLONE_NEWTIME
)

// Personalities Docker allows: PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32, and 0xffffffff (query).
var allowedPersonalities = []uint32{0, 0x8, 0x20000, 0x20008, 0xffffffff}

// Netlink protocols a sandbox may open: routing (ip, getaddrinfo's AI_ADDRCONFIG), socket diagnostics (ss),
// audit (login tools write audit records; the kernel refuses them outside the initial user namespace) and
// uevents (read-only device events). NETLINK_NETFILTER (the firewall), XFRM, GENERIC (a large, bug-prone
// surface) and the rest are closed.
var allowedNetlink = []uint32{unix.NETLINK_ROUTE, unix.NETLINK_SOCK_DIAG, unix.NETLINK_AUDIT, unix.NETLINK_KOBJECT_UEVENT}

// IP protocols a sandbox may open in AF_INET/AF_INET6 stream and datagram sockets: the default (0), TCP, UDP,
// ICMP and ICMPv6 (unprivileged ping sockets, when ping_group_range allows) and MPTCP. SCTP, UDP-Lite and DCCP
// are closed: rarely needed, module-loaded on first use, and a source of kernel bugs.
var allowedIPProtocols = []uint32{0, unix.IPPROTO_ICMP, unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMPV6, unix.IPPROTO_MPTCP}

// argRules are the syscalls allowed for some arguments only; each returns its check as BPF code that ends in a
// return on every path.
var argRules = map[string]struct {
	why  string
	code func() []bpf.Instruction
}{
	"clone": {"threads and processes, but no new namespace of any type (a new user namespace would give back " +
		"every capability within it)", func() []bpf.Instruction {
		return []bpf.Instruction{
			ldArg(0),
			bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: cloneNSFlags, SkipTrue: 1},
			retAllow, retEPERM,
		}
	}},
	"unshare": {"unsharing the caller's file table or file system attributes, but no namespace of any type",
		func() []bpf.Instruction {
			return []bpf.Instruction{
				ldArg(0),
				bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: unshareNSFlags, SkipTrue: 1},
				retAllow, retEPERM,
			}
		}},
	"socket": {"unix, IPv4/IPv6 stream and datagram (TCP, UDP, ICMP, MPTCP) and some netlink sockets; no " +
		"packet (AF_PACKET, or AF_INET with the obsolete SOCK_PACKET), raw, vsock, XDP sockets, no netfilter " +
		"netlink, and no other family (each is kernel code loaded on demand)", socketCheck},
	"socketcall": {"i386's multiplexed socket calls: socket() through it cannot be judged (its arguments are " +
		"in memory), so that one is refused; 32-bit programs get sockets through the socket syscall",
		func() []bpf.Instruction {
			return []bpf.Instruction{
				ldArg(0),
				bpf.JumpIf{Cond: bpf.JumpEqual, Val: 1, SkipTrue: 1}, // SYS_SOCKET
				retAllow, retEPERM,
			}
		}},
	"personality": {"the execution domains Docker allows (a 32-bit uname, the query); others change how the " +
		"kernel treats the process (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE)", func() []bpf.Instruction {
		out := []bpf.Instruction{ldArg(0)}
		for i, p := range allowedPersonalities {
			out = append(out, bpf.JumpIf{Cond: bpf.JumpEqual, Val: p, SkipTrue: uint8(len(allowedPersonalities) - i)})
		}
		return append(out, retEPERM, retAllow)
	}},
	// Changing group ids is allowed, except to another sandbox's group (see SandboxGIDBase): a gid from
	// SandboxGIDBase up goes to the supervisor, which lets a process take only its own sandbox's.
	"setgid":      {sandboxGroupWhy, gidCheck(1)},
	"setgid32":    {sandboxGroupWhy, gidCheck(1)},
	"setfsgid":    {sandboxGroupWhy, gidCheck(1)},
	"setfsgid32":  {sandboxGroupWhy, gidCheck(1)},
	"setregid":    {sandboxGroupWhy, gidCheck(2)},
	"setregid32":  {sandboxGroupWhy, gidCheck(2)},
	"setresgid":   {sandboxGroupWhy, gidCheck(3)},
	"setresgid32": {sandboxGroupWhy, gidCheck(3)},
	// Scheduling of another process: the kernel checks the uid only, which fork siblings share.
	"sched_setaffinity":  {schedWhy, pidCheck(0)},
	"sched_setparam":     {schedWhy, pidCheck(0)},
	"sched_setscheduler": {schedWhy, pidCheck(0)},
	"sched_setattr":      {schedWhy, pidCheck(0)},
	"setpriority":        {prioWhy, whichWhoCheck(0)}, // PRIO_PROCESS
	"ioprio_set":         {prioWhy, whichWhoCheck(1)}, // IOPRIO_WHO_PROCESS
	"prlimit64": {"reading any process's limits and setting one's own (pid 0: setrlimit, ulimit); setting " +
		"another process's limits is refused, since fork siblings share a uid and could starve each other",
		func() []bpf.Instruction {
			return []bpf.Instruction{
				ldArg(0),
				bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipTrue: 4}, // pid 0: the caller → allow
				bpf.LoadAbsolute{Off: offArgs + 8*2, Size: 4},        // new_limit, low word
				bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipFalse: 3},
				bpf.LoadAbsolute{Off: offArgs + 8*2 + 4, Size: 4}, // new_limit, high word
				bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipFalse: 1},
				retAllow, retEPERM,
			}
		}},
}

// SandboxGIDBase is the first sandbox group id. Every process of a sandbox runs with the group id
// SandboxGIDBase + the pid of the sandbox's agent in the family's PID namespace (unique among the family's live
// sandboxes): the members of a fork family share a user namespace and a root uid, and the kernel lets a process
// open another's /proc/<pid>/mem, environ, fd or root, or ptrace it, when their uids and gids agree (and it
// holds the target's capabilities). Different groups make each sandbox's processes out of its siblings' reach
// as long as no sibling can take another's group, which this package's filter and supervisor see to. The ids
// are above the 16-bit range, so i386's old 16-bit calls cannot name one.
const SandboxGIDBase = 1 << 16

const schedWhy = "the caller's own scheduling (pid 0) freely; another process's (the kernel checks only the " +
	"uid, which fork siblings share) goes to the supervisor, which allows a target in the caller's own sandbox"

const prioWhy = "the priority of the caller (who 0) freely; of another process through the supervisor, as for " +
	"sched_setaffinity; of a process group or every process of a user (which would reach fork siblings) refused"

// pidCheck returns the check of a call whose argument i is a pid: ALLOW for 0 (the caller), else USER_NOTIF.
func pidCheck(i int) func() []bpf.Instruction {
	return func() []bpf.Instruction {
		return []bpf.Instruction{
			ldArg(i),
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipFalse: 1},
			retAllow, retNotify,
		}
	}
}

// whichWhoCheck returns the check of setpriority(which, who, ...) and ioprio_set: which == process (the value
// given) with who 0 is the caller: ALLOW; with another who: USER_NOTIF; any other which (a process group, a
// user): EPERM.
func whichWhoCheck(process uint32) func() []bpf.Instruction {
	return func() []bpf.Instruction {
		return []bpf.Instruction{
			ldArg(0),
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: process, SkipFalse: 4},
			ldArg(1),
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipFalse: 1},
			retAllow, retNotify, retEPERM,
		}
	}
}

const sandboxGroupWhy = "changing group ids within the user namespace; a sandbox group (from SandboxGIDBase " +
	"up) is judged by the supervisor: a process may take its own sandbox's group only, since the kernel lets a " +
	"process reach (/proc/<pid>/mem, ptrace) another of the same uid and gids"

// gidCheck returns the check of a call whose first n arguments are gids: USER_NOTIF when any of them is a
// sandbox group (SandboxGIDBase up; -1, "unchanged", is not), else ALLOW. On i386, the 16-bit calls (setgid,
// setregid, ...) cannot name one; a value with junk above 16 bits goes to the supervisor, which refuses it.
func gidCheck(n int) func() []bpf.Instruction {
	return func() []bpf.Instruction {
		var out []bpf.Instruction
		for i := 0; i < n; i++ {
			out = append(out,
				ldArg(i),
				bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: SandboxGIDBase, SkipFalse: 2}, // below: next argument
				bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0xffffffff, SkipTrue: 1},               // -1: next argument
				retNotify,
			)
		}
		return append(out, retAllow)
	}
}

func socketCheck() []bpf.Instruction {
	// domain: AF_UNIX → allow; AF_INET, AF_INET6 → inet; AF_NETLINK → netlink; else EPERM.
	inet := []bpf.Instruction{
		ldArg(1),
		bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xf}, // SOCK_TYPE_MASK: drop SOCK_NONBLOCK, SOCK_CLOEXEC
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SOCK_STREAM, SkipTrue: 1},
		// not a datagram socket either: skip the load and the protocol checks to their ret EPERM
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SOCK_DGRAM, SkipFalse: uint8(1 + len(allowedIPProtocols))},
		ldArg(2),
	}
	inet = append(inet, oneOf(allowedIPProtocols)...)
	netlink := append([]bpf.Instruction{ldArg(2)}, oneOf(allowedNetlink)...)
	// Layout: 0 ld domain; 1-4 jeq unix/inet/inet6/netlink; 5 ret EPERM; 6 ret ALLOW; 7 inet; 7+len(inet) netlink.
	const inetAt = 7
	netlinkAt := inetAt + len(inet)
	out := []bpf.Instruction{
		ldArg(0),
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_UNIX, SkipTrue: 6 - 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_INET, SkipTrue: inetAt - 3},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_INET6, SkipTrue: inetAt - 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_NETLINK, SkipTrue: uint8(netlinkAt - 5)},
		retEPERM,
		retAllow,
	}
	out = append(out, inet...)
	return append(out, netlink...)
}

// oneOf returns: jeq v[0] → allow; ...; ret EPERM; ret ALLOW (on A).
func oneOf(vals []uint32) []bpf.Instruction {
	var out []bpf.Instruction
	for i, v := range vals {
		out = append(out, bpf.JumpIf{Cond: bpf.JumpEqual, Val: v, SkipTrue: uint8(len(vals) - i)})
	}
	return append(out, retEPERM, retAllow)
}

// Offsets into struct seccomp_data: args[i] is a u64 at offArgs+8*i; on little-endian x86 its low 32 bits come
// first.
const offArgs = 16

func ldArg(i int) bpf.Instruction { return bpf.LoadAbsolute{Off: uint32(offArgs + 8*i), Size: 4} }

var (
	retAllow  = bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW}
	retNotify = bpf.RetConstant{Val: unix.SECCOMP_RET_USER_NOTIF}
	retEPERM  = bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)}
	retENOSYS = bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)}
)

// action is what the profile does with one syscall number of one architecture.
type action int

const (
	vDeny   action = iota // ERRNO(EPERM), the default
	vAllow                // ALLOW whatever the arguments
	vNotify               // USER_NOTIF: the supervisor decides
	vNoSys                // ERRNO(ENOSYS)
	vArgs                 // the argument check of argRules[name]
)

type rule struct {
	v    action
	name string // for vArgs
}

// archPolicy returns the rule of every syscall number the profile does not deny, for one architecture's table
// of names and its notified syscalls.
func archPolicy(numbers map[string]uint32, notified map[uint32]op) (map[uint32]rule, error) {
	rules := map[uint32]rule{}
	set := func(name string, r rule) error {
		nr, ok := numbers[name]
		if !ok {
			return nil // not on this architecture
		}
		if old, dup := rules[nr]; dup && old != r {
			return fmt.Errorf("seccomp policy: %s (%d) has two verdicts", name, nr)
		}
		rules[nr] = r
		return nil
	}
	for _, g := range allowGroups {
		for _, n := range g.names {
			if err := set(n, rule{v: vAllow}); err != nil {
				return nil, err
			}
		}
	}
	for n := range argRules {
		if err := set(n, rule{v: vArgs, name: n}); err != nil {
			return nil, err
		}
	}
	for _, n := range noSysNames {
		if err := set(n, rule{v: vNoSys}); err != nil {
			return nil, err
		}
	}
	for nr := range notified {
		if _, dup := rules[nr]; dup {
			return nil, fmt.Errorf("seccomp policy: notified syscall %d also has a verdict", nr)
		}
		rules[nr] = rule{v: vNotify}
	}
	return rules, nil
}

// segment is a run [lo, next segment's lo) of syscall numbers with one rule.
type segment struct {
	lo uint32
	r  rule
}

// segments turns the rules into consecutive runs covering every number from 0 up; numbers above the highest
// rule are denied.
func segments(rules map[uint32]rule) []segment {
	nrs := make([]uint32, 0, len(rules))
	for nr := range rules {
		nrs = append(nrs, nr)
	}
	sort.Slice(nrs, func(i, j int) bool { return nrs[i] < nrs[j] })
	var out []segment
	add := func(lo uint32, r rule) {
		// An argument check covers one number; other runs merge with an equal neighbour.
		if n := len(out); n > 0 && out[n-1].r == r && r.v != vArgs {
			return
		}
		out = append(out, segment{lo, r})
	}
	next := uint32(0)
	for _, nr := range nrs {
		if nr > next {
			add(next, rule{v: vDeny})
		}
		add(nr, rules[nr])
		next = nr + 1
	}
	add(next, rule{v: vDeny})
	return out
}

// leaf returns the code of one segment: a return, or an argument check.
func leaf(r rule) []bpf.Instruction {
	switch r.v {
	case vAllow:
		return []bpf.Instruction{retAllow}
	case vNotify:
		return []bpf.Instruction{retNotify}
	case vNoSys:
		return []bpf.Instruction{retENOSYS}
	case vArgs:
		return argRules[r.name].code()
	}
	return []bpf.Instruction{retEPERM}
}

// searchTree returns a binary search over the segments on the syscall number in A: each node compares with the
// first number of its right half, so a syscall that is not cached by the kernel pays about log2(segments)
// comparisons. Every leaf ends in a return, so subtrees are simply laid out one after the other; a jump too far
// for a conditional jump's 8-bit offset goes through an unconditional one.
func searchTree(segs []segment) []bpf.Instruction {
	if len(segs) == 1 {
		return leaf(segs[0].r)
	}
	mid := len(segs) / 2
	left, right := searchTree(segs[:mid]), searchTree(segs[mid:])
	var out []bpf.Instruction
	if len(left) <= 255 {
		out = append(out, bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: segs[mid].lo, SkipTrue: uint8(len(left))})
	} else {
		out = append(out,
			bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: segs[mid].lo, SkipFalse: 1},
			bpf.Jump{Skip: uint32(len(left))})
	}
	out = append(out, left...)
	return append(out, right...)
}
