//go:build linux

package seccomp

import (
	"encoding/binary"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The machinery filter refuses exactly its deny-list, on both architectures, and allows everything else,
// numbers beyond the tables included (a deny-list: ramify's own code may use a syscall newer than the tables).
func TestMachineryProgramVerdicts(t *testing.T) {
	vm, err := bpf.NewVM(machineryInstructions())
	if err != nil {
		t.Fatal(err)
	}
	run := func(arch, nr uint32) uint32 {
		data := make([]byte, 64)
		binary.BigEndian.PutUint32(data[0:], nr)
		binary.BigEndian.PutUint32(data[4:], arch)
		ret, err := vm.Run(data)
		if err != nil {
			t.Fatal(err)
		}
		return uint32(ret)
	}
	if _, err := MachineryProgram(); err != nil {
		t.Fatal(err)
	}
	for _, a := range archs {
		denied := map[uint32]bool{}
		for _, n := range machineryClosed {
			if nr, ok := a.numbers[n]; ok {
				denied[nr] = true
			}
		}
		if len(denied) < 30 {
			t.Fatalf("%s: only %d denied numbers", a.name, len(denied))
		}
		for nr := uint32(0); nr < 1000; nr++ {
			want := uint32(unix.SECCOMP_RET_ALLOW)
			if denied[nr] {
				want = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
			}
			if got := run(a.arch, nr); got != want {
				t.Errorf("%s nr %d: %#x, want %#x", a.name, nr, got, want)
			}
		}
		for _, n := range []string{"mount", "pivot_root", "setns", "unshare", "clone", "seccomp", "ioctl", "pidfd_getfd", "sethostname", "move_mount"} {
			if nr, ok := a.numbers[n]; ok && run(a.arch, nr) != unix.SECCOMP_RET_ALLOW {
				t.Errorf("%s: the machinery needs %s", a.name, n)
			}
		}
	}
	if got := run(auditArchX8664, x32SyscallBit|1); got != unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS) {
		t.Errorf("x32: %#x", got)
	}
	if got := run(0xdeadbeef, 0); got != unix.SECCOMP_RET_KILL_PROCESS {
		t.Errorf("unknown arch: %#x", got)
	}
}
