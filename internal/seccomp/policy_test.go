//go:build linux

package seccomp

import (
	"maps"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

const (
	retA  = unix.SECCOMP_RET_ALLOW
	retE  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retNS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	retN  = unix.SECCOMP_RET_USER_NOTIF
)

var archs = []struct {
	name     string
	arch     uint32
	numbers  map[string]uint32
	notified map[uint32]op
}{
	{"x86_64", auditArchX8664, x8664Numbers(), syscallsX8664},
	{"i386", auditArchI386, i386Numbers(), syscallsI386},
}

func TestProgramBuilds(t *testing.T) {
	ins, err := buildInstructions()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := Program()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d instructions", len(ins))
	if len(prog) != len(ins) || len(prog) > 4096 {
		t.Fatalf("program of %d instructions (built %d)", len(prog), len(ins))
	}
}

// Every name of the policy must be a syscall of some architecture (a typo would silently close or not open it),
// and no name may be both open and closed.
func TestPolicyNames(t *testing.T) {
	x86, i386 := x8664Numbers(), i386Numbers()
	known := func(n string) bool {
		_, a := x86[n]
		_, b := i386[n]
		return a || b
	}
	seen := map[string]string{}
	check := func(n, where string) {
		if !known(n) {
			t.Errorf("%s: %q is no syscall of x86_64 or i386", where, n)
		}
		if w, dup := seen[n]; dup {
			t.Errorf("%q is in %s and in %s", n, w, where)
		}
		seen[n] = where
	}
	for _, g := range allowGroups {
		for _, n := range g.names {
			check(n, "allowGroups")
		}
	}
	for _, g := range closedGroups {
		for _, n := range g.names {
			check(n, "closedGroups")
		}
	}
	for n := range argRules {
		check(n, "argRules")
	}
	for _, n := range noSysNames {
		check(n, "noSysNames")
	}
	for _, a := range archs {
		for nr, o := range a.notified {
			for n, nr2 := range a.numbers {
				if nr2 == nr && n != o.String() {
					t.Errorf("%s: notified %d is %q in the table, %q in the notify map", a.name, nr, n, o)
				}
				if nr2 == nr {
					if w, dup := seen[n]; dup {
						t.Errorf("notified %q is also in %s", n, w)
					}
				}
			}
		}
	}
}

// Every syscall number of both architectures gets exactly the action the policy data says, whatever its
// arguments; numbers beyond the tables are refused.
func TestPolicyVerdictPerSyscall(t *testing.T) {
	for _, a := range archs {
		rules, err := archPolicy(a.numbers, a.notified)
		if err != nil {
			t.Fatal(err)
		}
		names := map[uint32]string{}
		for n, nr := range a.numbers {
			names[nr] = n
		}
		for nr := uint32(0); nr < 600; nr++ {
			r := rules[nr]
			want := map[action]uint32{vDeny: retE, vAllow: retA, vNotify: retN, vNoSys: retNS}[r.v]
			if r.v == vArgs {
				continue // TestPolicyArguments
			}
			for _, args := range [][]uint64{nil, {0xffffffffffffffff, 1, 2, 3, 4, 5}, {cloneNSFlags, unix.AF_PACKET, unix.SOCK_RAW}} {
				if got := runProgram(t, a.arch, nr, args...); got != want {
					t.Errorf("%s %s (%d) args %x: action %#x, want %#x", a.name, names[nr], nr, args, got, want)
				}
			}
		}
		for _, nr := range []uint32{1000, 0x3fffffff, 0xffffffff} {
			want := uint32(retE)
			if a.arch == auditArchX8664 && nr >= x32SyscallBit {
				want = retNS
			}
			if got := runProgram(t, a.arch, nr); got != want {
				t.Errorf("%s nr %#x: action %#x, want %#x", a.name, nr, got, want)
			}
		}
	}
}

// The syscalls the issue names must be closed on both architectures (where they exist), with EPERM, or ENOSYS
// for clone3.
func TestPolicyClosesKernelSurface(t *testing.T) {
	closed := []string{
		"add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
		"io_uring_enter", "io_uring_register", "mount", "umount", "umount2", "pivot_root", "move_mount", "fsopen",
		"fsconfig", "fsmount", "fspick", "open_tree", "mount_setattr", "kexec_load", "kexec_file_load",
		"init_module", "finit_module", "delete_module", "clock_settime", "clock_adjtime", "settimeofday",
		"adjtimex", "stime", "reboot", "swapon", "swapoff", "acct", "quotactl", "open_by_handle_at",
		"lookup_dcookie", "nfsservctl", "vhangup", "iopl", "ioperm", "syslog", "sethostname",
	}
	for _, a := range archs {
		for _, n := range closed {
			nr, ok := a.numbers[n]
			if !ok {
				continue
			}
			if got := runProgram(t, a.arch, nr, 0, 0, 0); got != retE {
				t.Errorf("%s %s (%d): action %#x, want EPERM", a.name, n, nr, got)
			}
		}
		for _, g := range closedGroups {
			for _, n := range g.names {
				if nr, ok := a.numbers[n]; ok {
					if got := runProgram(t, a.arch, nr); got != retE {
						t.Errorf("%s %s (%d): action %#x, want EPERM", a.name, n, nr, got)
					}
				}
			}
		}
		if got := runProgram(t, a.arch, a.numbers["clone3"]); got != retNS {
			t.Errorf("%s clone3: action %#x, want ENOSYS", a.name, got)
		}
		// The notified syscalls stay notified.
		for nr, o := range a.notified {
			if got := runProgram(t, a.arch, nr, 0, 0, 0); got != retN {
				t.Errorf("%s %s (%d): action %#x, want USER_NOTIF", a.name, o, nr, got)
			}
		}
	}
}

func TestPolicyArguments(t *testing.T) {
	const hi = 1 << 32 // a high word the kernel ignores for these int arguments
	cases := []struct {
		name string
		args []uint64
		want uint32
	}{
		// glibc's pthread_create and fork, Go's and posix_spawn's vfork.
		{"clone", []uint64{unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID}, retA},
		{"clone", []uint64{unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID | uint64(unix.SIGCHLD)}, retA},
		{"clone", []uint64{unix.CLONE_VM | unix.CLONE_VFORK | unix.CLONE_PIDFD | uint64(unix.SIGCHLD)}, retA},
		{"clone", []uint64{unix.CLONE_NEWUSER}, retE},
		{"clone", []uint64{unix.CLONE_NEWNS | uint64(unix.SIGCHLD)}, retE},
		{"clone", []uint64{unix.CLONE_NEWPID}, retE},
		{"clone", []uint64{unix.CLONE_NEWNET}, retE},
		{"clone", []uint64{unix.CLONE_NEWUTS}, retE},
		{"clone", []uint64{unix.CLONE_NEWIPC}, retE},
		{"clone", []uint64{unix.CLONE_NEWCGROUP}, retE},
		{"clone", []uint64{hi | unix.CLONE_NEWUSER}, retE},
		{"sched_setaffinity", []uint64{0, 8, 0}, retA},
		{"sched_setaffinity", []uint64{1234, 8, 0}, retN},
		{"sched_setscheduler", []uint64{hi | 0, 0, 0}, retA},
		{"sched_setscheduler", []uint64{77, 0, 0}, retN},
		{"sched_setparam", []uint64{77, 0}, retN},
		{"sched_setattr", []uint64{0, 0, 0}, retA},
		{"sched_setattr", []uint64{0xffffffff, 0, 0}, retN},
		{"setpriority", []uint64{0, 0, 10}, retA},    // PRIO_PROCESS, the caller
		{"setpriority", []uint64{0, 1234, 10}, retN}, // another process
		{"setpriority", []uint64{1, 0, 10}, retE},    // PRIO_PGRP
		{"setpriority", []uint64{2, 0, 10}, retE},    // PRIO_USER: every process of the uid
		{"ioprio_set", []uint64{1, 0, 0}, retA},      // IOPRIO_WHO_PROCESS, the caller
		{"ioprio_set", []uint64{1, 99, 0}, retN},
		{"ioprio_set", []uint64{2, 0, 0}, retE}, // IOPRIO_WHO_PGRP
		{"ioprio_set", []uint64{3, 0, 0}, retE}, // IOPRIO_WHO_USER
		{"setgid", []uint64{0}, retA},
		{"setgid", []uint64{1000}, retA},
		{"setgid", []uint64{SandboxGIDBase - 1}, retA},
		{"setgid", []uint64{SandboxGIDBase}, retN},
		{"setgid", []uint64{SandboxGIDBase + 4242}, retN},
		{"setgid", []uint64{hi | SandboxGIDBase + 7}, retN},
		{"setgid", []uint64{hi | 7}, retA},
		{"setfsgid", []uint64{0xffffffff}, retA},
		{"setfsgid", []uint64{SandboxGIDBase + 1}, retN},
		{"setregid", []uint64{0xffffffff, 0}, retA},
		{"setregid", []uint64{0, SandboxGIDBase + 3}, retN},
		{"setregid", []uint64{SandboxGIDBase + 3, 0xffffffff}, retN},
		{"setresgid", []uint64{0xffffffff, 0xffffffff, 0xffffffff}, retA},
		{"setresgid", []uint64{1, 2, 3}, retA},
		{"setresgid", []uint64{0xffffffff, 0xffffffff, SandboxGIDBase}, retN},
		{"setresgid", []uint64{SandboxGIDBase, 0, 0}, retN},
		{"setresgid32", []uint64{0, SandboxGIDBase + 9, 0}, retN},
		{"setgid32", []uint64{SandboxGIDBase + 9}, retN},
		{"unshare", []uint64{unix.CLONE_FILES}, retA},
		{"unshare", []uint64{unix.CLONE_FS | unix.CLONE_SYSVSEM}, retA},
		{"unshare", []uint64{unix.CLONE_NEWUSER}, retE},
		{"unshare", []uint64{unix.CLONE_NEWNS}, retE},
		{"unshare", []uint64{unix.CLONE_NEWTIME}, retE},
		{"unshare", []uint64{unix.CLONE_NEWNET | unix.CLONE_FILES}, retE},
		{"unshare", []uint64{unix.CLONE_NEWCGROUP}, retE},
		{"socket", []uint64{unix.AF_UNIX, unix.SOCK_STREAM | unix.SOCK_CLOEXEC, 0}, retA},
		{"socket", []uint64{unix.AF_UNIX, unix.SOCK_DGRAM, 0}, retA},
		{"socket", []uint64{unix.AF_UNIX, unix.SOCK_SEQPACKET, 0}, retA},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_STREAM, 0}, retA},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_STREAM | unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC, unix.IPPROTO_TCP}, retA},
		{"socket", []uint64{unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_UDP}, retA},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP}, retA},
		{"socket", []uint64{unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_ICMPV6}, retA},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP}, retA},
		{"socket", []uint64{unix.AF_NETLINK, unix.SOCK_RAW | unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE}, retA},
		{"socket", []uint64{unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_SOCK_DIAG}, retA},
		{"socket", []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT}, retA},
		{"socket", []uint64{unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_KOBJECT_UEVENT}, retA},
		{"socket", []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER}, retE},
		{"socket", []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_XFRM}, retE},
		{"socket", []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_GENERIC}, retE},
		{"socket", []uint64{unix.AF_PACKET, unix.SOCK_RAW, 0x300}, retE},
		{"socket", []uint64{unix.AF_PACKET, unix.SOCK_DGRAM, 0}, retE},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_PACKET, 0x300}, retE},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP}, retE},
		{"socket", []uint64{unix.AF_INET6, unix.SOCK_RAW | unix.SOCK_CLOEXEC, unix.IPPROTO_RAW}, retE},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_SEQPACKET, unix.IPPROTO_SCTP}, retE},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP}, retE},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_DCCP, 0}, retE},
		{"socket", []uint64{unix.AF_VSOCK, unix.SOCK_STREAM, 0}, retE},
		{"socket", []uint64{unix.AF_XDP, unix.SOCK_RAW, 0}, retE},
		{"socket", []uint64{unix.AF_ALG, unix.SOCK_SEQPACKET, 0}, retE},
		{"socket", []uint64{unix.AF_BLUETOOTH, unix.SOCK_STREAM, 0}, retE},
		{"socket", []uint64{hi | unix.AF_PACKET, unix.SOCK_RAW, 0}, retE},
		{"socket", []uint64{unix.AF_INET, hi | unix.SOCK_RAW, 0}, retE},
		{"socket", []uint64{unix.AF_NETLINK, unix.SOCK_RAW, hi | unix.NETLINK_NETFILTER}, retE},
		{"personality", []uint64{0}, retA},
		{"personality", []uint64{0xffffffff}, retA},
		{"personality", []uint64{0x20008}, retA},
		{"personality", []uint64{0x0040000}, retE}, // ADDR_NO_RANDOMIZE
		{"personality", []uint64{0x0400000}, retE}, // READ_IMPLIES_EXEC
		{"prlimit64", []uint64{0, unix.RLIMIT_NOFILE, 0x7ffc0000, 0}, retA},
		{"prlimit64", []uint64{1234, unix.RLIMIT_NOFILE, 0, 0x7ffc0000}, retA},
		{"prlimit64", []uint64{1234, unix.RLIMIT_NOFILE, 0x7ffc0000, 0}, retE},
		{"prlimit64", []uint64{1234, unix.RLIMIT_NOFILE, 0x7ffc00000000, 0}, retE},
	}
	for _, a := range archs {
		for _, c := range cases {
			nr, ok := a.numbers[c.name]
			if !ok {
				continue // setgid32 and the like: i386 only
			}
			if got := runProgram(t, a.arch, nr, c.args...); got != c.want {
				t.Errorf("%s %s(%#x): action %#x, want %#x", a.name, c.name, c.args, got, c.want)
			}
		}
	}
	sc := i386Numbers()["socketcall"]
	for call, want := range map[uint64]uint32{1: retE, 2: retA, 3: retA, 8: retA, 16: retA} {
		if got := runProgram(t, auditArchI386, sc, call, 0); got != want {
			t.Errorf("i386 socketcall(%d): action %#x, want %#x", call, got, want)
		}
	}
}

// constAllow emulates the kernel's seccomp_is_const_allow (kernel/seccomp.c, 5.11+): it runs the filter with
// only nr and arch known and answers whether it returns ALLOW without looking at anything else. Syscalls for
// which it does are cached by the kernel and never run the filter.
func constAllow(t *testing.T, raw []bpf.RawInstruction, arch, nr uint32) bool {
	var a uint32
	for pc := 0; pc < len(raw); pc++ {
		ins := raw[pc]
		switch ins.Op {
		case 0x20: // BPF_LD|BPF_W|BPF_ABS
			switch ins.K {
			case offNr:
				a = nr
			case offArch:
				a = arch
			default:
				return false
			}
		case 0x06: // BPF_RET|BPF_K
			return ins.K == unix.SECCOMP_RET_ALLOW
		case 0x05: // BPF_JMP|BPF_JA
			pc += int(ins.K)
		case 0x15, 0x35, 0x25, 0x45: // JEQ, JGE, JGT, JSET with K
			var res bool
			switch ins.Op {
			case 0x15:
				res = a == ins.K
			case 0x35:
				res = a >= ins.K
			case 0x25:
				res = a > ins.K
			case 0x45:
				res = a&ins.K != 0
			}
			if res {
				pc += int(ins.Jt)
			} else {
				pc += int(ins.Jf)
			}
		case 0x54: // BPF_ALU|BPF_AND|BPF_K
			a &= ins.K
		default:
			t.Fatalf("instruction %d (%#x) is not one the kernel's cache emulation understands", pc, ins.Op)
		}
	}
	t.Fatal("ran off the end of the filter")
	return false
}

// Every syscall the policy allows whatever its arguments must be cacheable by the kernel (so it costs nothing),
// and every other one must not be (the kernel would otherwise allow it without asking the filter).
func TestPolicyCacheable(t *testing.T) {
	prog, err := Program()
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]bpf.RawInstruction, len(prog))
	for i, f := range prog {
		raw[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
	}
	for _, a := range archs {
		rules, err := archPolicy(a.numbers, a.notified)
		if err != nil {
			t.Fatal(err)
		}
		cached := 0
		for nr := uint32(0); nr < 600; nr++ {
			want := rules[nr].v == vAllow
			if got := constAllow(t, raw, a.arch, nr); got != want {
				t.Errorf("%s nr %d (rule %+v): cacheable %v, want %v", a.name, nr, rules[nr], got, want)
			}
			if want {
				cached++
			}
		}
		t.Logf("%s: %d syscalls allowed whatever their arguments (cached by the kernel)", a.name, cached)
	}
}

// TestArgCallNumbers: the supervisor's numbers of the calls it sees for some arguments only are those the syscall
// tables give argCallOps' names.
func TestArgCallNumbers(t *testing.T) {
	for _, a := range []struct {
		name    string
		written map[uint32]op
		numbers map[string]uint32
	}{{"x86_64", argCallsX8664, x8664Numbers()}, {"i386", argCallsI386, i386Numbers()}} {
		if want := argCalls(a.numbers); !maps.Equal(a.written, want) {
			t.Errorf("%s: argCalls %v, the tables say %v", a.name, a.written, want)
		}
	}
}
