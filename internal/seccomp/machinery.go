//go:build linux

package seccomp

import (
	"fmt"
	"runtime"
	"sort"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The family init and the agents (ramify's machinery in a family) cannot carry the sandbox profile: they mount,
// pivot_root, create namespaces and serve the listeners. They carry a deny-list instead, [MachineryProgram]:
// the parts of the kernel they never use and that an attacker who took one over would want first. Everything
// they start inherits it (a filter survives fork and execve), under the profile that sandbox processes add.
var machineryClosed = []string{
	"add_key", "request_key", "keyctl",
	"bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "create_module",
	"query_module", "get_kernel_syms",
	"clock_settime", "clock_settime64", "clock_adjtime", "clock_adjtime64", "settimeofday", "adjtimex", "stime",
	"reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup",
	"open_by_handle_at", "lookup_dcookie", "nfsservctl", "_sysctl", "uselib", "bdflush",
	"iopl", "ioperm", "vm86", "vm86old", "migrate_pages", "move_pages",
}

// denySegments returns the segments of a deny-list: the numbers of names (on the architecture of numbers) fail
// with EPERM, every other number is allowed.
func denySegments(numbers map[string]uint32, names []string) []segment {
	var nrs []uint32
	for _, n := range names {
		if nr, ok := numbers[n]; ok {
			nrs = append(nrs, nr)
		}
	}
	sort.Slice(nrs, func(i, j int) bool { return nrs[i] < nrs[j] })
	allowRule, denyRule := rule{v: vAllow}, rule{v: vDeny}
	var out []segment
	next := uint32(0)
	for _, nr := range nrs {
		switch {
		case nr < next: // a duplicate
			continue
		case nr > next:
			out = append(out, segment{next, allowRule}, segment{nr, denyRule})
		case len(out) == 0 || out[len(out)-1].r != denyRule: // nr == next: 0, or right after an allowed run
			out = append(out, segment{nr, denyRule})
		} // else nr == next right after a denied run: it extends it
		next = nr + 1
	}
	return append(out, segment{next, allowRule})
}

func machineryInstructions() []bpf.Instruction {
	return dispatch(denySegments(x8664Numbers(), machineryClosed), denySegments(i386Numbers(), machineryClosed))
}

// MachineryProgram returns the family init's and agents' filter (see machineryClosed).
func MachineryProgram() ([]unix.SockFilter, error) {
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("seccomp: filter program for %s: unsupported architecture", runtime.GOARCH)
	}
	return assemble(machineryInstructions())
}

// InstallMachineryFilter installs [MachineryProgram] on every thread of the calling process
// (SECCOMP_FILTER_FLAG_TSYNC), without a listener, so that a sandbox process started below it can still install
// the sandbox filter with one. The caller needs CAP_SYS_ADMIN in its user namespace (or no_new_privs).
func InstallMachineryFilter() error {
	prog, err := MachineryProgram()
	if err != nil {
		return err
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC,
		uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("seccomp: install the machinery filter: %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("seccomp: install the machinery filter: thread %d could not be synchronized", r)
	}
	return nil
}
