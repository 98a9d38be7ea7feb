//go:build linux

package seccomp

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"runtime"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Architecture tokens of seccomp_data.arch (linux/audit.h).
const (
	auditArchX8664 = 0xc000003e // AUDIT_ARCH_X86_64
	auditArchI386  = 0x40000003 // AUDIT_ARCH_I386
	x32SyscallBit  = 0x40000000 // __X32_SYSCALL_BIT
)

// Offsets into struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
)

// op names a policed syscall independently of the architecture's numbering.
type op int

const (
	opKill op = iota + 1
	opTkill
	opTgkill
	opRtSigqueueinfo
	opRtTgsigqueueinfo
	opPidfdOpen
	opPidfdSendSignal
	opPidfdGetfd
	opPtrace
	opProcessVMReadv
	opProcessVMWritev
	opProcessMadvise
	opKcmp
	opSetns
	opSetgid    // setgid, setfsgid: one gid
	opSetregid  // two gids
	opSetresgid // three gids
	opSchedPid  // sched_setaffinity, sched_setparam, sched_setscheduler, sched_setattr: pid in args[0]
	opWhichWho  // setpriority, ioprio_set with "which" a process: pid in args[1]
)

var opNames = map[op]string{
	opKill: "kill", opTkill: "tkill", opTgkill: "tgkill", opRtSigqueueinfo: "rt_sigqueueinfo",
	opRtTgsigqueueinfo: "rt_tgsigqueueinfo", opPidfdOpen: "pidfd_open", opPidfdSendSignal: "pidfd_send_signal",
	opPidfdGetfd: "pidfd_getfd", opPtrace: "ptrace", opProcessVMReadv: "process_vm_readv",
	opProcessVMWritev: "process_vm_writev", opProcessMadvise: "process_madvise", opKcmp: "kcmp", opSetns: "setns",
	opSetgid: "setgid", opSetregid: "setregid", opSetresgid: "setresgid", opSchedPid: "sched_set*",
	opWhichWho: "setpriority/ioprio_set",
}

func (o op) String() string {
	if n, ok := opNames[o]; ok {
		return n
	}
	return fmt.Sprintf("op(%d)", int(o))
}

// syscallsX8664 and syscallsI386 map each architecture's syscall numbers to the policed operations
// (arch/x86/entry/syscalls/syscall_64.tbl and syscall_32.tbl).
var syscallsX8664 = map[uint32]op{
	62: opKill, 200: opTkill, 234: opTgkill, 129: opRtSigqueueinfo, 297: opRtTgsigqueueinfo,
	434: opPidfdOpen, 424: opPidfdSendSignal, 438: opPidfdGetfd, 101: opPtrace,
	310: opProcessVMReadv, 311: opProcessVMWritev, 440: opProcessMadvise, 312: opKcmp, 308: opSetns,
}

var syscallsI386 = map[uint32]op{
	37: opKill, 238: opTkill, 270: opTgkill, 178: opRtSigqueueinfo, 335: opRtTgsigqueueinfo,
	434: opPidfdOpen, 424: opPidfdSendSignal, 438: opPidfdGetfd, 26: opPtrace,
	347: opProcessVMReadv, 348: opProcessVMWritev, 440: opProcessMadvise, 349: opKcmp, 346: opSetns,
}

// argCallOps are the calls that reach the supervisor only for some arguments (policy.go's argRules): group-id
// changes naming a sandbox group (setfsgid takes one gid, as setgid does; on i386 the plain names are the 16-bit
// calls, the 32 ones the 32-bit), and scheduling calls aimed at another process. Their numbers per architecture
// are argCallsX8664 and argCallsI386.
var argCallOps = map[string]op{
	"setgid": opSetgid, "setgid32": opSetgid, "setfsgid": opSetgid, "setfsgid32": opSetgid,
	"setregid": opSetregid, "setregid32": opSetregid, "setresgid": opSetresgid, "setresgid32": opSetresgid,
	"sched_setaffinity": opSchedPid, "sched_setparam": opSchedPid, "sched_setscheduler": opSchedPid,
	"sched_setattr": opSchedPid, "setpriority": opWhichWho, "ioprio_set": opWhichWho,
}

// argCallsX8664 and argCallsI386 are argCallOps by number, as the supervisor looks them up: written out rather than
// derived from the syscall tables at start (argCalls), which every agent would then build and keep;
// TestArgCallNumbers checks them against the tables.
var (
	argCallsX8664 = map[uint32]op{
		106: opSetgid, 114: opSetregid, 119: opSetresgid, 123: opSetgid, // setgid, setregid, setresgid, setfsgid
		141: opWhichWho, 251: opWhichWho, // setpriority, ioprio_set
		142: opSchedPid, 144: opSchedPid, 203: opSchedPid, 314: opSchedPid, // sched_setparam, _setscheduler, _setaffinity, _setattr
	}
	argCallsI386 = map[uint32]op{
		46: opSetgid, 214: opSetgid, 139: opSetgid, 216: opSetgid, // setgid, setgid32, setfsgid, setfsgid32
		71: opSetregid, 204: opSetregid, 170: opSetresgid, 210: opSetresgid, // setregid, setregid32, setresgid, setresgid32
		97: opWhichWho, 289: opWhichWho, // setpriority, ioprio_set
		154: opSchedPid, 156: opSchedPid, 241: opSchedPid, 351: opSchedPid, // sched_setparam, _setscheduler, _setaffinity, _setattr
	}
)

// argCalls maps one architecture's numbers of argCallOps to their operations.
func argCalls(numbers map[string]uint32) map[uint32]op {
	out := map[uint32]op{}
	for name, o := range argCallOps {
		if nr, ok := numbers[name]; ok {
			out[nr] = o
		}
	}
	return out
}

// lookupOp returns the operation of a trapped syscall, or 0.
func lookupOp(arch uint32, nr int32) op {
	switch arch {
	case auditArchX8664:
		if o, ok := syscallsX8664[uint32(nr)]; ok {
			return o
		}
		return argCallsX8664[uint32(nr)]
	case auditArchI386:
		if o, ok := syscallsI386[uint32(nr)]; ok {
			return o
		}
		return argCallsI386[uint32(nr)]
	}
	return 0
}

// instructions builds the filter: the default profile (policy.go) with the notified syscalls of
// syscallsX8664/syscallsI386 returning USER_NOTIF:
//
//	ld arch
//	jeq X86_64 → x86
//	jeq I386 → i386
//	ret KILL_PROCESS
//	x86:  ld nr; jge 0x40000000 → ret ERRNO(ENOSYS); <binary search over x86_64 numbers>
//	i386: ld nr; <binary search over i386 numbers>
//
// Each search ends in a return (ALLOW, USER_NOTIF, ERRNO) or an argument check (see searchTree). Syscalls that
// return ALLOW whatever their arguments never load an argument, so kernels from 5.11 on cache their verdict and
// skip the filter for them altogether.
func instructions() []bpf.Instruction {
	prog, err := buildInstructions()
	if err != nil {
		panic(err) // the policy is static data; TestProgramBuilds catches this
	}
	return prog
}

func buildInstructions() ([]bpf.Instruction, error) {
	x86Rules, err := archPolicy(x8664Numbers(), syscallsX8664)
	if err != nil {
		return nil, err
	}
	i386Rules, err := archPolicy(i386Numbers(), syscallsI386)
	if err != nil {
		return nil, err
	}
	return dispatch(segments(x86Rules), segments(i386Rules)), nil
}

// dispatch returns a filter that checks the architecture and searches x86 or i386's segments for the syscall
// number (x32 syscalls answer ENOSYS, other architectures are killed).
func dispatch(x86, i386 []segment) []bpf.Instruction {
	x86Block := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: x32SyscallBit, SkipFalse: 1},
		retENOSYS,
	}
	x86Block = append(x86Block, searchTree(x86)...)
	i386Block := append([]bpf.Instruction{bpf.LoadAbsolute{Off: offNr, Size: 4}}, searchTree(i386)...)

	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		// 1: to the x86 block at 5
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArchX8664, SkipTrue: 3},
		// 2: I386 → the jump at 3, else the kill at 4
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArchI386, SkipFalse: 1},
		// 3: over the kill and the x86 block (too long for a conditional jump) to the i386 block
		bpf.Jump{Skip: uint32(1 + len(x86Block))},
		bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS},
	}
	prog = append(prog, x86Block...)
	return append(prog, i386Block...)
}

// compiled is the filter the policy of this package compiles to (compile), for amd64: 8 bytes per instruction as
// ProgramBytes describes. It is compiled ahead, not as each process starts: every spare agent built it twice (once
// for its command thread, once for its interpreter), ~0.4 MB of allocations that stayed in the agent's heap until
// its first collection, a fork child's largest share of private memory right after its first call.
// TestEmbeddedProgramIsCurrent fails when the policy and this file differ; its -update flag rewrites the file.
//
//go:embed program_amd64.bin
var compiled string

// Program returns the seccomp filter as a classic-BPF program for the running architecture. Only amd64 (x86_64) is
// supported; other architectures return an error.
func Program() ([]unix.SockFilter, error) {
	b, err := ProgramBytes()
	if err != nil {
		return nil, err
	}
	out := make([]unix.SockFilter, len(b)/unix.SizeofSockFilter)
	for i := range out {
		c := b[i*unix.SizeofSockFilter:]
		out[i] = unix.SockFilter{Code: binary.LittleEndian.Uint16(c), Jt: c[2], Jf: c[3], K: binary.LittleEndian.Uint32(c[4:])}
	}
	return out, nil
}

// compile builds the filter from the policy (policy.go and the tables above): what program_amd64.bin holds.
func compile() ([]unix.SockFilter, error) {
	ins, err := buildInstructions()
	if err != nil {
		return nil, err
	}
	return assemble(ins)
}

// assemble turns a filter into the kernel's sock_filter array.
func assemble(ins []bpf.Instruction) ([]unix.SockFilter, error) {
	raw, err := bpf.Assemble(ins)
	if err != nil {
		return nil, fmt.Errorf("seccomp: assemble filter: %w", err)
	}
	if len(raw) > 4096 { // BPF_MAXINSNS
		return nil, fmt.Errorf("seccomp: filter has %d instructions, more than BPF_MAXINSNS", len(raw))
	}
	out := make([]unix.SockFilter, len(raw))
	for i, ins := range raw {
		out[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	return out, nil
}

// ProgramBytes returns the same program as [Program] as the raw bytes of a struct sock_filter array (8 bytes per
// instruction, little endian: u16 code, u8 jt, u8 jf, u32 k), for a process that installs it itself (for instance
// Python through ctypes, with struct sock_fprog{len = len(bytes)/8, filter = bytes} and [FilterFlags]).
func ProgramBytes() ([]byte, error) {
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("seccomp: filter program for %s: unsupported architecture", runtime.GOARCH)
	}
	return []byte(compiled), nil
}

// encode turns a program into the bytes of ProgramBytes.
func encode(prog []unix.SockFilter) []byte {
	out := make([]byte, 0, len(prog)*unix.SizeofSockFilter)
	for _, f := range prog {
		out = binary.LittleEndian.AppendUint16(out, f.Code)
		out = append(out, f.Jt, f.Jf)
		out = binary.LittleEndian.AppendUint32(out, f.K)
	}
	return out
}
