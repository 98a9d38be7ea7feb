//go:build linux

package seccomp

import (
	"bytes"
	"encoding/binary"
	"flag"
	"os"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

var update = flag.Bool("update", false, "rewrite program_amd64.bin from the policy")

// TestEmbeddedProgramIsCurrent: the filter every sandbox process installs is the one compiled ahead into
// program_amd64.bin; it must be what the policy compiles to now.
func TestEmbeddedProgramIsCurrent(t *testing.T) {
	prog, err := compile()
	if err != nil {
		t.Fatal(err)
	}
	want := encode(prog)
	if *update {
		if err := os.WriteFile("program_amd64.bin", want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := ProgramBytes()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("program_amd64.bin (%d bytes) is not what the policy compiles to (%d bytes): run "+
			"go test ./internal/seccomp -run TestEmbeddedProgramIsCurrent -update", len(got), len(want))
	}
}

// TestProgramIsNotBuiltAtRunTime: getting the filter copies it, nothing more (building it allocated ~0.15 MB).
func TestProgramIsNotBuiltAtRunTime(t *testing.T) {
	if n := testing.AllocsPerRun(10, func() { ProgramBytes() }); n > 1 {
		t.Errorf("ProgramBytes: %.0f allocations, want 1 (a copy of the compiled program)", n)
	}
	if n := testing.AllocsPerRun(10, func() { Program() }); n > 2 {
		t.Errorf("Program: %.0f allocations, want 2", n)
	}
}

func TestProgramBytesDecode(t *testing.T) {
	prog, err := Program()
	if err != nil {
		t.Fatal(err)
	}
	b, err := ProgramBytes()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 8*len(prog) {
		t.Fatalf("ProgramBytes: %d bytes for %d instructions", len(b), len(prog))
	}
	raw := make([]bpf.RawInstruction, len(prog))
	for i := range prog {
		c := b[8*i:]
		f := unix.SockFilter{Code: binary.LittleEndian.Uint16(c), Jt: c[2], Jf: c[3], K: binary.LittleEndian.Uint32(c[4:])}
		if f != prog[i] {
			t.Fatalf("instruction %d: bytes decode to %+v, Program has %+v", i, f, prog[i])
		}
		raw[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
	}
	// Disassembling must give back the instructions we built (bpf.Disassemble normalises jumps, so compare the
	// re-assembled code).
	got, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("program does not disassemble completely")
	}
	again, err := bpf.Assemble(got)
	if err != nil {
		t.Fatal(err)
	}
	for i := range raw {
		if again[i] != raw[i] {
			t.Errorf("instruction %d: reassembled %#v, built %#v", i, again[i], raw[i])
		}
	}
}

// runProgram runs the filter on a seccomp_data in the x/net/bpf VM. The VM loads words big-endian (network order)
// while the kernel loads seccomp_data in host order, so the data is encoded big-endian here.
var (
	vmOnce sync.Once
	vm     *bpf.VM
	vmErr  error
)

func runProgram(t *testing.T, arch uint32, nr uint32, args ...uint64) uint32 {
	t.Helper()
	vmOnce.Do(func() { vm, vmErr = bpf.NewVM(instructions()) })
	if vmErr != nil {
		t.Fatal(vmErr)
	}
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[0:], nr)
	binary.BigEndian.PutUint32(data[4:], arch)
	// The kernel loads args[i] (a little-endian u64) as two 32-bit words: the low one at 16+8i, the high one at
	// 20+8i. The VM reads each word big-endian, so store each word big-endian at its kernel offset.
	for i, a := range args {
		binary.BigEndian.PutUint32(data[offArgs+8*i:], uint32(a))
		binary.BigEndian.PutUint32(data[offArgs+8*i+4:], uint32(a>>32))
	}
	ret, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(ret)
}

func TestProgramActions(t *testing.T) {
	for nr := range syscallsX8664 {
		if got := runProgram(t, auditArchX8664, nr); got != unix.SECCOMP_RET_USER_NOTIF {
			t.Errorf("x86_64 %s (%d): action %#x, want USER_NOTIF", syscallsX8664[nr], nr, got)
		}
	}
	for nr := range syscallsI386 {
		if got := runProgram(t, auditArchI386, nr); got != unix.SECCOMP_RET_USER_NOTIF {
			t.Errorf("i386 %s (%d): action %#x, want USER_NOTIF", syscallsI386[nr], nr, got)
		}
	}
	cases := []struct {
		name     string
		arch, nr uint32
		want     uint32
	}{
		{"x86_64 read", auditArchX8664, unix.SYS_READ, unix.SECCOMP_RET_ALLOW},
		{"x86_64 getpid", auditArchX8664, unix.SYS_GETPID, unix.SECCOMP_RET_ALLOW},
		{"x86_64 i386 kill number (37 = alarm)", auditArchX8664, 37, unix.SECCOMP_RET_ALLOW},
		{"x32 kill", auditArchX8664, x32SyscallBit | 62, unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{"x32 read", auditArchX8664, x32SyscallBit, unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{"i386 x86_64 kill number (62 = ustat, closed)", auditArchI386, 62, unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		{"i386 read", auditArchI386, 3, unix.SECCOMP_RET_ALLOW},
		{"aarch64", 0xc00000b7, 129, unix.SECCOMP_RET_KILL_PROCESS},
	}
	for _, c := range cases {
		if got := runProgram(t, c.arch, c.nr); got != c.want {
			t.Errorf("%s: action %#x, want %#x", c.name, got, c.want)
		}
	}
}

func TestStructSizes(t *testing.T) {
	if s := unsafe.Sizeof(notif{}); s != 80 {
		t.Errorf("sizeof(seccomp_notif) = %d, want 80", s)
	}
	if s := unsafe.Sizeof(notifResp{}); s != 24 {
		t.Errorf("sizeof(seccomp_notif_resp) = %d, want 24", s)
	}
	if s := unsafe.Sizeof(notifAddfd{}); s != 24 {
		t.Errorf("sizeof(seccomp_notif_addfd) = %d, want 24", s)
	}
	// _IOC(dir, '!', nr, size) = dir<<30 | size<<16 | '!'<<8 | nr
	ioc := func(dir, nr, size uintptr) uintptr { return dir<<30 | size<<16 | '!'<<8 | nr }
	const write, read = 1, 2
	if got := ioc(read|write, 0, unsafe.Sizeof(notif{})); got != ioctlNotifRecv {
		t.Errorf("NOTIF_RECV %#x", got)
	}
	if got := ioc(read|write, 1, unsafe.Sizeof(notifResp{})); got != ioctlNotifSend {
		t.Errorf("NOTIF_SEND %#x", got)
	}
	if got := ioc(write, 2, 8); got != ioctlNotifIDValid {
		t.Errorf("NOTIF_ID_VALID %#x", got)
	}
	if got := ioc(write, 3, unsafe.Sizeof(notifAddfd{})); got != ioctlNotifAddfd {
		t.Errorf("NOTIF_ADDFD %#x", got)
	}
	if err := checkNotifSizes(); err != nil {
		t.Error(err)
	}
}
