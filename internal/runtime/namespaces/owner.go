package namespaces

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os/exec"
	goruntime "runtime"

	"golang.org/x/sys/unix"
)

// Family owners. The kernel charges several per-user counters not to the uid a process runs as but, up the user
// namespace tree, to the uid that owns each user namespace: inotify instances and watches, user namespaces, and
// the like (ucounts). A family's user namespace created by the server (euid 0) is owned by host root, so one
// sandbox holding 128 inotify instances made a host root process's inotify_init1 fail. Each family's user
// namespace is therefore created under an owner uid of its own, drawn from a range no host account uses: a
// family can exhaust only its own counters, not host root's nor another family's.
const (
	ownerUIDBase  = 1 << 30 // host uids from here on are family owners
	ownerUIDRange = 1 << 24
)

// secbitNoSetuidFixup is SECBIT_NO_SETUID_FIXUP: changing the effective uid keeps the effective capabilities.
const secbitNoSetuidFixup = 1 << 2

// newOwnerUID draws a family owner uid.
func newOwnerUID() int {
	var b [4]byte
	rand.Read(b[:]) //nolint:errcheck // never fails on Linux
	return ownerUIDBase + int(binary.LittleEndian.Uint32(b[:])%ownerUIDRange)
}

// startOwnedBy starts cmd (which creates a user namespace) from a thread whose effective uid is owner, so that
// owner owns the new user namespace. Only the calling OS thread changes (raw setresuid, not Go's all-threads
// wrapper), and it keeps its capabilities meanwhile (SECBIT_NO_SETUID_FIXUP), which writing the namespace's id
// maps needs. Should the thread fail to turn back into root, it is never unlocked and dies with its goroutine.
func startOwnedBy(cmd *exec.Cmd, owner int) error {
	goruntime.LockOSThread()
	bits, err := unix.PrctlRetInt(unix.PR_GET_SECUREBITS, 0, 0, 0, 0)
	if err != nil {
		goruntime.UnlockOSThread()
		return fmt.Errorf("securebits: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits|secbitNoSetuidFixup), 0, 0, 0); err != nil {
		goruntime.UnlockOSThread()
		return fmt.Errorf("securebits: %w", err)
	}
	restored := false
	defer func() {
		if restored {
			goruntime.UnlockOSThread()
		}
	}()
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(owner), ^uintptr(0)); errno != 0 {
		restored = unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0) == nil
		return fmt.Errorf("become family owner %d: %w", owner, errno)
	}
	startErr := cmd.Start()
	_, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0))
	restored = errno == 0 && unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0) == nil
	return startErr
}
