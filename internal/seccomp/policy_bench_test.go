//go:build linux

package seccomp

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// BenchmarkFilteredSyscall measures what a syscall costs a process under no filter, under the filter as it was
// before the default profile (USER_NOTIF for the process-targeting calls, ALLOW for everything else), and under
// the profile. A child process (this test binary) installs the filter on its thread and times b.N calls:
//
//   - getpid, read(/dev/zero, 1): allowed whatever their arguments, so the kernel caches the verdict (5.11+);
//
//   - personality(0xffffffff): argument-checked, so it runs the whole filter (binary search, then the check);
//
//   - keyctl: refused by the profile (the filter runs, ERRNO).
//
//     go test -run '^$' -bench FilteredSyscall ./internal/seccomp
func BenchmarkFilteredSyscall(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (a filter without no_new_privs)")
	}
	for _, call := range []string{"getpid", "read", "personality", "keyctl"} {
		for _, filter := range []string{"none", "notify-only", "profile"} {
			b.Run(call+"/"+filter, func(b *testing.B) {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), benchChildEnv+"="+filter+"/"+call+"/"+strconv.Itoa(b.N), "GODEBUG=asyncpreemptoff=1")
				out, err := cmd.CombinedOutput()
				if err != nil {
					b.Fatalf("child: %v: %s", err, out)
				}
				ns, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
				if err != nil {
					b.Fatalf("child: %q", out)
				}
				b.ReportMetric(ns/float64(b.N), "ns/syscall")
			})
		}
	}
}

const benchChildEnv = "RAMIFY_SECCOMP_BENCH_CHILD"

func init() {
	if spec := os.Getenv(benchChildEnv); spec != "" {
		benchChild(spec)
	}
}

// benchChild installs the named filter on this thread (without a listener: a USER_NOTIF verdict answers ENOSYS,
// and none of the timed calls is notified) and prints how many nanoseconds n calls took.
func benchChild(spec string) {
	parts := strings.Split(spec, "/")
	filter, call := parts[0], parts[1]
	n, _ := strconv.Atoi(parts[2])
	runtime.LockOSThread()
	debug.SetGCPercent(-1)
	var ins []bpf.Instruction
	switch filter {
	case "notify-only":
		ins = notifyOnlyInstructions()
	case "profile":
		ins = instructions()
	}
	if ins != nil {
		raw, err := bpf.Assemble(ins)
		if err != nil {
			fmt.Println(err)
			os.Exit(2)
		}
		prog := make([]unix.SockFilter, len(raw))
		for i, r := range raw {
			prog[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
		}
		fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
		if _, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
			fmt.Println("seccomp:", e)
			os.Exit(2)
		}
		runtime.KeepAlive(prog)
	}
	fd, err := unix.Open("/dev/zero", unix.O_RDONLY, 0)
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	var buf [1]byte
	p := uintptr(unsafe.Pointer(&buf[0]))
	start := time.Now()
	switch call {
	case "getpid":
		for i := 0; i < n; i++ {
			unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0)
		}
	case "read":
		for i := 0; i < n; i++ {
			unix.RawSyscall(unix.SYS_READ, uintptr(fd), p, 1)
		}
	case "personality":
		for i := 0; i < n; i++ {
			unix.RawSyscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
		}
	case "keyctl":
		for i := 0; i < n; i++ {
			unix.RawSyscall(unix.SYS_KEYCTL, 0, ^uintptr(1), 0) // KEYCTL_GET_KEYRING_ID, KEY_SPEC_PROCESS_KEYRING
		}
	}
	fmt.Println(time.Since(start).Nanoseconds())
	os.Exit(0)
}

// notifyOnlyInstructions is the filter as it was before the default profile (commit 70cd924's instructions()):
// per architecture, a linear chain of jeq for the notified syscalls, ALLOW for everything else.
func notifyOnlyInstructions() []bpf.Instruction {
	block := func(m map[uint32]op, x32 bool) []bpf.Instruction {
		nrs := make([]uint32, 0, len(m))
		for nr := range m {
			nrs = append(nrs, nr)
		}
		out := []bpf.Instruction{bpf.LoadAbsolute{Off: offNr, Size: 4}}
		n := len(nrs)
		if x32 {
			out = append(out, bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: x32SyscallBit, SkipTrue: uint8(n + 2)})
		}
		for i, nr := range nrs {
			out = append(out, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipTrue: uint8(n - 1 - i + 1)})
		}
		out = append(out, retAllow, retNotify)
		if x32 {
			out = append(out, retENOSYS)
		}
		return out
	}
	x86, i386 := block(syscallsX8664, true), block(syscallsI386, false)
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArchX8664, SkipTrue: 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArchI386, SkipTrue: uint8(1 + len(x86))},
		bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS},
	}
	return append(append(prog, x86...), i386...)
}
