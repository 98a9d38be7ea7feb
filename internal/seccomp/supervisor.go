//go:build linux

package seccomp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Supervisor answers the notifications of listener fds created by [InstallOnThisThread] (or by a process that
// installed [ProgramBytes] itself). It must run in the PID namespace of the filtered processes (so that the pids of
// notifications, of syscall arguments and of procRoot agree) and must not itself be filtered. It holds no per-listener
// state: one Supervisor may serve many listeners at once.
type Supervisor struct {
	procRoot string
	log      *slog.Logger
	guard    Guard
}

// Guard tells the supervisor about ramify's own processes among the filtered ones' neighbours (the family init and
// the agents): sandbox code may never target them, even in its own sandbox. Its methods are called concurrently.
type Guard interface {
	// Protected reports whether the thread group tgid is one of ramify's processes.
	Protected(tgid int) bool
	// Namespaces returns the namespace links ("net:[4026532000]") that a protected process registered, which the
	// supervisor cannot read from /proc (protected processes are not dumpable), or nil.
	Namespaces(tgid int) []string
	// Holders returns the protected processes that registered namespace link (a sandbox's agent holds its
	// sandbox's network, mount, IPC and UTS namespaces).
	Holders(link string) []int
}

// SetGuard makes s refuse every call that targets a process g protects; call it before Serve.
func (s *Supervisor) SetGuard(g Guard) { s.guard = g }

// sameProcess reports whether threads a and b belong to one process.
func (s *Supervisor) sameProcess(a, b int) bool {
	if a == b {
		return true
	}
	ta, err1 := s.threadGroup(a)
	tb, err2 := s.threadGroup(b)
	return err1 == nil && err2 == nil && ta == tb
}

// protected reports whether pid (a thread or process) belongs to one of ramify's processes.
func (s *Supervisor) protected(pid int) bool {
	if s.guard == nil {
		return false
	}
	if s.guard.Protected(pid) {
		return true
	}
	tgid, err := s.threadGroup(pid)
	return err == nil && tgid != pid && s.guard.Protected(tgid)
}

// NewSupervisor returns a supervisor that judges calls by comparing cgroups read from procRoot (normally "/proc").
// A nil log discards messages.
func NewSupervisor(procRoot string, log *slog.Logger) *Supervisor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Supervisor{procRoot: procRoot, log: log}
}

// Serve handles notifications from listenerFD until every filtered task has exited (it then returns nil), ctx ends
// (it returns ctx.Err()) or the listener fails. It closes listenerFD when done. Notifications of one listener are
// handled one at a time; call Serve in a goroutine per listener.
//
// The wait for a notification is the Go runtime's poller's (the listener in non-blocking mode, registered like a
// socket): a goroutine waiting in poll(2) held an OS thread of its own, and a family init serves a listener for
// every sandbox and spare agent of the family (~40 KB of user and kernel stacks per thread; an idle sandbox's init
// held 9-11 threads, a family that forked 27).
func (s *Supervisor) Serve(ctx context.Context, listenerFD int) error {
	if err := checkNotifSizes(); err != nil {
		unix.Close(listenerFD)
		return err
	}
	if err := unix.SetNonblock(listenerFD, true); err != nil {
		if errors.Is(err, unix.EBADF) {
			return fmt.Errorf("seccomp: serve: listener fd %d is not open", listenerFD)
		}
		unix.Close(listenerFD)
		return fmt.Errorf("seccomp: serve: listener: %w", err)
	}
	f := os.NewFile(uintptr(listenerFD), "seccomp-listener")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("seccomp: serve: listener: %w", err)
	}
	// The end of ctx wakes the wait: a read deadline in the past.
	stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Now()) }) //nolint:errcheck // pollable: see below
	defer stop()

	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		var n notif          // NOTIF_RECV requires a zeroed structure
		var got, exited bool // a notification received; every filtered task has exited
		var rerr error
		werr := rc.Read(func(fd uintptr) bool {
			// Is a notification pending? NOTIF_RECV would wait for one whatever the descriptor's mode.
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			for {
				_, err := unix.Poll(pfd, 0)
				if err == nil {
					break
				}
				if !errors.Is(err, unix.EINTR) {
					rerr = fmt.Errorf("seccomp: serve: poll listener: %w", err)
					return true
				}
			}
			re := pfd[0].Revents
			switch {
			case re&unix.POLLNVAL != 0:
				rerr = fmt.Errorf("seccomp: serve: listener fd %d is not open", listenerFD)
			case re&unix.POLLIN != 0:
				n = notif{}
				if _, err := ioctlPtr(int(fd), ioctlNotifRecv, unsafe.Pointer(&n)); err != nil {
					// ENOENT: the task died (or was interrupted) before we received its notification.
					if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINTR) {
						rerr = fmt.Errorf("seccomp: serve: receive notification: %w", err)
					}
				} else {
					got = true
				}
			case re&(unix.POLLHUP|unix.POLLERR) != 0:
				exited = true
			default:
				return false // nothing yet: the poller wakes this goroutine when there is
			}
			return true
		})
		switch {
		case werr != nil && ctx.Err() != nil:
			return ctx.Err()
		case werr != nil:
			return fmt.Errorf("seccomp: serve: wait for a notification: %w", werr)
		case rerr != nil:
			return rerr
		case exited:
			return nil
		case got:
			s.handle(listenerFD, &n)
		}
	}
}

// handle decides one notification and answers it.
func (s *Supervisor) handle(listenerFD int, n *notif) {
	o := lookupOp(n.Data.Arch, n.Data.Nr)
	if o == 0 || n.Pid == 0 {
		s.log.Warn("seccomp: unexpected notification", "pid", n.Pid, "arch", n.Data.Arch, "nr", n.Data.Nr)
		s.replyErrno(listenerFD, n.ID, unix.EPERM)
		return
	}
	r := request{caller: int(n.Pid), arch: n.Data.Arch, op: o, args: n.Data.Args}
	if r.arch != auditArchX8664 {
		for i := range r.args {
			r.args[i] &= 0xffffffff
		}
	}
	v := s.decide(r)
	s.log.Debug("seccomp: decision", "pid", r.caller, "syscall", o.String(), "args", r.args[:4],
		"verdict", v.kind.String(), "errno", v.errno, "reason", v.reason)
	switch v.kind {
	case vErrno:
		s.replyErrno(listenerFD, n.ID, v.errno)
	case vContinue:
		if !s.idValid(listenerFD, n.ID) {
			return
		}
		s.reply(listenerFD, notifResp{ID: n.ID, Flags: userNotifFlagContinue})
	case vKillGroup:
		s.killGroup(listenerFD, n, v)
	case vPidfdSendSignal, vPidfdGetfd:
		s.pidfdCall(listenerFD, n, r, v)
	default:
		s.replyErrno(listenerFD, n.ID, unix.EPERM)
	}
}

// idValid reports whether the notification is still pending (its task alive and still in the syscall), so that
// /proc data read for its pid describe the caller.
func (s *Supervisor) idValid(listenerFD int, id uint64) bool {
	_, err := ioctlPtr(listenerFD, ioctlNotifIDValid, unsafe.Pointer(&id))
	return err == nil
}

func (s *Supervisor) reply(listenerFD int, resp notifResp) {
	if _, err := ioctlPtr(listenerFD, ioctlNotifSend, unsafe.Pointer(&resp)); err != nil {
		// ENOENT: the caller died or was interrupted by a signal; nobody waits for the answer.
		if !errors.Is(err, unix.ENOENT) {
			s.log.Warn("seccomp: answer notification", "err", err)
		}
	}
}

func (s *Supervisor) replyErrno(listenerFD int, id uint64, errno unix.Errno) {
	s.reply(listenerFD, notifResp{ID: id, Error: -int32(errno)})
}

func (s *Supervisor) replyValue(listenerFD int, id uint64, val int64) {
	s.reply(listenerFD, notifResp{ID: id, Val: val})
}

// errnoOf returns the errno in err, or EPERM.
func errnoOf(err error) unix.Errno {
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return unix.EPERM
}

// killGroup emulates kill(0 / -1 / -pgrp, sig) for the processes of the caller's sandbox. Targets are opened as
// pidfds and re-checked, so that a reused pid is never signalled.
func (s *Supervisor) killGroup(listenerFD int, n *notif, v verdict) {
	var pidfds []int
	defer func() {
		for _, fd := range pidfds {
			unix.Close(fd)
		}
	}()
	for _, p := range v.targets {
		fd, err := unix.PidfdOpen(p, 0)
		if err != nil {
			continue // exited meanwhile
		}
		// The pidfd pins the process that has pid p now; check that this one is the process we chose.
		key, err := s.sandboxKey(p)
		ok := err == nil && key == v.callerKey
		if ok && v.pgrp != 0 {
			g, err := s.processGroup(p)
			ok = err == nil && g == v.pgrp
		}
		if !ok {
			unix.Close(fd)
			continue
		}
		pidfds = append(pidfds, fd)
	}
	callerFD := -1
	if v.includeCaller {
		fd, err := unix.PidfdOpen(v.callerTgid, 0)
		if err == nil {
			callerFD = fd
			pidfds = append(pidfds, fd) // closed by the deferred loop
		}
	}
	if !s.idValid(listenerFD, n.ID) {
		return
	}
	sent := false
	lastErr := unix.ESRCH
	for _, fd := range pidfds {
		if fd == callerFD {
			continue
		}
		if err := unix.PidfdSendSignal(fd, unix.Signal(v.sig), nil, 0); err != nil {
			lastErr = errnoOf(err)
			continue
		}
		sent = true
	}
	// The caller last, before the answer, as the kernel does: the notification has been received, so (with
	// SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV) a non-fatal signal stays pending until the call returns instead of
	// interrupting it; a fatal one kills the caller, and then nobody waits for the answer.
	if callerFD >= 0 {
		if err := unix.PidfdSendSignal(callerFD, unix.Signal(v.sig), nil, 0); err != nil {
			lastErr = errnoOf(err)
		} else {
			sent = true
		}
	}
	if sent {
		s.replyValue(listenerFD, n.ID, 0)
	} else {
		s.replyErrno(listenerFD, n.ID, lastErr)
	}
}

// sizeofSiginfo is sizeof(siginfo_t) on x86_64.
const sizeofSiginfo = 128

// siTkill is SI_TKILL, the si_code of tkill and tgkill.
const siTkill = -6

// pidfdCall emulates pidfd_send_signal and pidfd_getfd on a copy of the caller's pidfd: the copy cannot be swapped
// by another thread of the caller between the check and the call.
func (s *Supervisor) pidfdCall(listenerFD int, n *notif, r request, v verdict) {
	tgid, err := s.threadGroup(r.caller)
	if err != nil {
		s.replyErrno(listenerFD, n.ID, unix.EPERM)
		return
	}
	callerFD, err := unix.PidfdOpen(tgid, 0)
	if err != nil {
		s.replyErrno(listenerFD, n.ID, unix.EPERM)
		return
	}
	defer unix.Close(callerFD)
	// Now that callerFD pins tgid, make sure tgid is the caller's thread group.
	if !s.idValid(listenerFD, n.ID) {
		return
	}
	fd, err := unix.PidfdGetfd(callerFD, v.fd, 0)
	if err != nil {
		if errors.Is(err, unix.EBADF) {
			s.replyErrno(listenerFD, n.ID, unix.EBADF)
		} else {
			s.log.Warn("seccomp: copy the caller's pidfd", "pid", r.caller, "fd", v.fd, "err", err)
			s.replyErrno(listenerFD, n.ID, unix.EPERM)
		}
		return
	}
	defer unix.Close(fd)
	target, err := pidfdTarget(filepath.Join(s.procRoot, "self", "fdinfo", strconv.Itoa(fd)))
	if err != nil {
		if errors.Is(err, errNoPidfd) && v.kind == vPidfdGetfd {
			s.replyErrno(listenerFD, n.ID, unix.EBADF)
		} else {
			// Includes /proc/<pid> directory fds, which pidfd_send_signal accepts but we do not resolve.
			s.replyErrno(listenerFD, n.ID, unix.EPERM)
		}
		return
	}
	if j := s.judgePidfdTarget(r.caller, v.callerKey, target); j.kind != vContinue {
		s.log.Debug("seccomp: decision", "pid", r.caller, "syscall", r.op.String(), "verdict", j.kind.String(),
			"errno", j.errno, "reason", j.reason)
		s.replyErrno(listenerFD, n.ID, j.errno)
		return
	}

	switch v.kind {
	case vPidfdSendSignal:
		var info []byte
		var infoPtr unsafe.Pointer
		if v.info != 0 {
			info = make([]byte, sizeofSiginfo)
			local := []unix.Iovec{{Base: &info[0], Len: sizeofSiginfo}}
			remote := []unix.RemoteIovec{{Base: uintptr(v.info), Len: sizeofSiginfo}}
			if m, err := unix.ProcessVMReadv(r.caller, local, remote, 0); err != nil || m != sizeofSiginfo {
				s.replyErrno(listenerFD, n.ID, unix.EFAULT)
				return
			}
			// struct siginfo starts with int si_signo, si_errno, si_code. A non-negative si_code (or SI_TKILL)
			// is only accepted by the kernel for a signal to oneself, which we, sending on the caller's behalf,
			// cannot forward.
			code := *(*int32)(unsafe.Pointer(&info[8]))
			if code >= 0 || code == siTkill {
				s.replyErrno(listenerFD, n.ID, unix.EPERM)
				return
			}
			infoPtr = unsafe.Pointer(&info[0])
		}
		_, _, errno := unix.Syscall6(unix.SYS_PIDFD_SEND_SIGNAL, uintptr(fd), uintptr(v.sig), uintptr(infoPtr),
			uintptr(v.flags), 0, 0)
		if errno != 0 {
			s.replyErrno(listenerFD, n.ID, errno)
			return
		}
		s.replyValue(listenerFD, n.ID, 0)
	case vPidfdGetfd:
		newFD, err := unix.PidfdGetfd(fd, v.targetFD, 0)
		if err != nil {
			s.replyErrno(listenerFD, n.ID, errnoOf(err))
			return
		}
		defer unix.Close(newFD)
		// Install the fd in the caller and answer with its number, atomically (SECCOMP_ADDFD_FLAG_SEND).
		add := notifAddfd{ID: n.ID, Flags: addfdFlagSend, Srcfd: uint32(newFD), NewfdFlags: unix.O_CLOEXEC}
		if _, err := ioctlPtr(listenerFD, ioctlNotifAddfd, unsafe.Pointer(&add)); err != nil {
			if !errors.Is(err, unix.ENOENT) {
				s.log.Warn("seccomp: install fd in caller", "pid", r.caller, "err", err)
				s.replyErrno(listenerFD, n.ID, errnoOf(err))
			}
		}
	}
}
