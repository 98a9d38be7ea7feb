//go:build linux

package seccomp

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seccompData mirrors struct seccomp_data (64 bytes).
type seccompData struct {
	Nr                 int32
	Arch               uint32
	InstructionPointer uint64
	Args               [6]uint64
}

// notif mirrors struct seccomp_notif (80 bytes).
type notif struct {
	ID    uint64
	Pid   uint32
	Flags uint32
	Data  seccompData
}

// notifResp mirrors struct seccomp_notif_resp (24 bytes).
type notifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// notifAddfd mirrors struct seccomp_notif_addfd (24 bytes).
type notifAddfd struct {
	ID         uint64
	Flags      uint32
	Srcfd      uint32
	Newfd      uint32
	NewfdFlags uint32
}

// notifSizes mirrors struct seccomp_notif_sizes.
type notifSizes struct {
	Notif     uint16
	NotifResp uint16
	Data      uint16
}

// ioctl requests of a seccomp listener fd (linux/seccomp.h, SECCOMP_IOC_MAGIC '!'):
//
//	SECCOMP_IOCTL_NOTIF_RECV     = _IOWR('!', 0, struct seccomp_notif)       = 0xc0502100
//	SECCOMP_IOCTL_NOTIF_SEND     = _IOWR('!', 1, struct seccomp_notif_resp)  = 0xc0182101
//	SECCOMP_IOCTL_NOTIF_ID_VALID = _IOW('!', 2, __u64)                       = 0x40082102
//	SECCOMP_IOCTL_NOTIF_ADDFD    = _IOW('!', 3, struct seccomp_notif_addfd)  = 0x40182103
const (
	ioctlNotifRecv    = 0xc0502100
	ioctlNotifSend    = 0xc0182101
	ioctlNotifIDValid = 0x40082102
	ioctlNotifAddfd   = 0x40182103

	userNotifFlagContinue = 1      // SECCOMP_USER_NOTIF_FLAG_CONTINUE
	addfdFlagSend         = 1 << 1 // SECCOMP_ADDFD_FLAG_SEND

	// PIDFD_SELF_THREAD and PIDFD_SELF_THREAD_GROUP (linux/pidfd.h, 6.15+): sentinel "pidfds" naming the caller.
	pidfdSelfThread      = -10000
	pidfdSelfThreadGroup = -20000
)

// ioctlPtr issues an ioctl whose argument is a pointer.
func ioctlPtr(fd int, req uintptr, arg unsafe.Pointer) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

// notifSizesFromKernel asks the kernel for the sizes of the notification structures (SECCOMP_GET_NOTIF_SIZES).
func notifSizesFromKernel() (notifSizes, error) {
	var sz notifSizes
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_NOTIF_SIZES, 0, uintptr(unsafe.Pointer(&sz)))
	if errno != 0 {
		return sz, fmt.Errorf("seccomp: SECCOMP_GET_NOTIF_SIZES: %w", errno)
	}
	return sz, nil
}

// checkNotifSizes verifies that the kernel's structures are no larger than ours (a larger seccomp_notif would make
// NOTIF_RECV write past our buffer; the ioctl numbers encode the sizes, so it would fail rather than do so, but say
// it plainly).
func checkNotifSizes() error {
	sz, err := notifSizesFromKernel()
	if err != nil {
		return err
	}
	if int(sz.Notif) != int(unsafe.Sizeof(notif{})) || int(sz.NotifResp) != int(unsafe.Sizeof(notifResp{})) ||
		int(sz.Data) != int(unsafe.Sizeof(seccompData{})) {
		return fmt.Errorf("seccomp: kernel notification sizes %+v differ from ours (notif %d, resp %d, data %d)",
			sz, unsafe.Sizeof(notif{}), unsafe.Sizeof(notifResp{}), unsafe.Sizeof(seccompData{}))
	}
	return nil
}

// FilterFlags are the seccomp(SECCOMP_SET_MODE_FILTER) flags the filter must be installed with, also by a process
// that installs [ProgramBytes] itself: SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV
// (Linux 5.19+). WAIT_KILLABLE_RECV makes a caller whose notification the supervisor has received wait for the answer
// without being interrupted by non-fatal signals; the emulation of kill(0) and kill(-pgrp) relies on it to signal the
// caller itself before answering (as the kernel would) without interrupting, and so restarting, the emulated call.
const FilterFlags = unix.SECCOMP_FILTER_FLAG_NEW_LISTENER | unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV

// InstallOnThisThread installs the filter of [Program] on the calling OS thread only (no SECCOMP_FILTER_FLAG_TSYNC)
// with [FilterFlags] and returns the listener fd (close-on-exec, as the kernel creates it: pass it
// to the supervisor, for instance over a unix socket with SCM_RIGHTS, before exec).
//
// The caller must have called runtime.LockOSThread and should execve soon after from the same thread, so that the
// new program inherits the filter. no_new_privs is not set (it would break setuid binaries in the sandbox): the
// caller needs CAP_SYS_ADMIN in its user namespace, which root in the sandbox's user namespace has. Installing fails
// with EBUSY when the thread already runs under a filter that has a listener.
func InstallOnThisThread() (listenerFD int, err error) {
	prog, err := Program()
	if err != nil {
		return -1, err
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, FilterFlags,
		uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return -1, fmt.Errorf("seccomp: install filter with listener: %w", errno)
	}
	return int(fd), nil
}
