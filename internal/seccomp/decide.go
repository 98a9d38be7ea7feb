//go:build linux

package seccomp

import (
	"errors"
	"math"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pidfdSignalProcessGroup is PIDFD_SIGNAL_PROCESS_GROUP (linux/pidfd.h, 6.9+): signal the target's process group.
const pidfdSignalProcessGroup = 1 << 2

// request is a trapped syscall, decoded from a notification.
type request struct {
	caller int // tid of the calling thread, in the supervisor's PID namespace
	arch   uint32
	op     op
	args   [6]uint64 // truncated to 32 bits for i386 callers
}

// verdictKind says how to answer a request.
type verdictKind int

const (
	vErrno           verdictKind = iota // fail the call with errno
	vContinue                           // let the kernel run the call (SECCOMP_USER_NOTIF_FLAG_CONTINUE)
	vKillGroup                          // emulate kill(0), kill(-1), kill(-pgrp) within the caller's sandbox
	vPidfdSendSignal                    // emulate pidfd_send_signal on a copy of the caller's pidfd
	vPidfdGetfd                         // emulate pidfd_getfd on a copy of the caller's pidfd
)

func (k verdictKind) String() string {
	switch k {
	case vErrno:
		return "errno"
	case vContinue:
		return "continue"
	case vKillGroup:
		return "kill-group"
	case vPidfdSendSignal:
		return "pidfd-send-signal"
	case vPidfdGetfd:
		return "pidfd-getfd"
	}
	return "verdict(" + strconv.Itoa(int(k)) + ")"
}

// verdict is the decision about one request. Only the fields of its kind are set.
type verdict struct {
	kind   verdictKind
	errno  unix.Errno
	reason string // for logs

	callerKey string // sandbox of the caller

	// vKillGroup
	sig           int
	pgrp          int   // process group to signal; 0 means every process (kill(-1))
	targets       []int // thread-group leaders to signal, the caller excluded
	callerTgid    int
	includeCaller bool // the caller's own process is designated too (signalled after the answer)

	// vPidfdSendSignal, vPidfdGetfd
	fd       int    // the caller's pidfd
	targetFD int    // pidfd_getfd's targetfd
	info     uint64 // pidfd_send_signal's info pointer (in the caller)
	flags    uint32 // pidfd_send_signal's flags
}

func deny(errno unix.Errno, reason string) verdict {
	return verdict{kind: vErrno, errno: errno, reason: reason}
}

func allow(reason string) verdict { return verdict{kind: vContinue, reason: reason} }

// decide judges a request from the /proc data under s.procRoot. It performs no action: fd copies, signals and the
// ID_VALID check are the caller's business.
func (s *Supervisor) decide(r request) verdict {
	callerKey, err := s.sandboxKey(r.caller)
	if err != nil {
		return deny(unix.EPERM, "caller: "+err.Error())
	}
	if s.protected(r.caller) {
		// ramify's own code (an agent's command-spawning thread, which carries the sandbox's filter so that the
		// commands it starts inherit it): trusted, and out of sandbox code's reach.
		return verdict{kind: vContinue, reason: "ramify's own process", callerKey: callerKey}
	}
	v := s.decideOp(r, callerKey)
	v.callerKey = callerKey
	return v
}

func (s *Supervisor) decideOp(r request, callerKey string) verdict {
	a := r.args
	switch r.op {
	case opKill:
		pid, sig := int32(a[0]), int32(a[1])
		if pid > 0 {
			return s.judgePid(r.caller, callerKey, int(pid))
		}
		return s.decideKillGroup(r, callerKey, pid, sig)
	case opTkill:
		tid := int32(a[0])
		if tid <= 0 {
			return deny(unix.EINVAL, "tkill: tid <= 0")
		}
		return s.judgePid(r.caller, callerKey, int(tid))
	case opRtSigqueueinfo:
		pid := int32(a[0])
		if pid <= 0 {
			// The kernel looks pid up as is (no group semantics) and finds nothing.
			return deny(unix.ESRCH, "rt_sigqueueinfo: pid <= 0")
		}
		return s.judgePid(r.caller, callerKey, int(pid))
	case opTgkill, opRtTgsigqueueinfo:
		tgid, tid := int32(a[0]), int32(a[1])
		if tgid <= 0 || tid <= 0 {
			return deny(unix.EINVAL, r.op.String()+": tgid or tid <= 0")
		}
		v := s.judgePid(r.caller, callerKey, int(tgid))
		if v.kind != vContinue {
			return v
		}
		ok, err := exists(s.procPath(int(tgid), "task", strconv.Itoa(int(tid))))
		if err != nil {
			return deny(unix.EPERM, err.Error())
		}
		if !ok {
			return deny(unix.ESRCH, "tid not in tgid")
		}
		return v
	case opPtrace:
		if a[0] == unix.PTRACE_TRACEME {
			return allow("PTRACE_TRACEME")
		}
		pid := int32(a[1])
		if pid <= 0 {
			return deny(unix.ESRCH, "ptrace: pid <= 0")
		}
		return s.judgePid(r.caller, callerKey, int(pid))
	case opProcessVMReadv, opProcessVMWritev:
		pid := int32(a[0])
		if pid <= 0 {
			return deny(unix.ESRCH, r.op.String()+": pid <= 0")
		}
		return s.judgePid(r.caller, callerKey, int(pid))
	case opPidfdOpen:
		pid := int32(a[0])
		if pid <= 0 {
			return deny(unix.EINVAL, "pidfd_open: pid <= 0")
		}
		return s.judgePid(r.caller, callerKey, int(pid))
	case opKcmp:
		for _, p := range []int32{int32(a[0]), int32(a[1])} {
			if p <= 0 {
				return deny(unix.ESRCH, "kcmp: pid <= 0")
			}
			if v := s.judgePid(r.caller, callerKey, int(p)); v.kind != vContinue {
				return v
			}
		}
		return allow("kcmp: both in sandbox")
	case opPidfdSendSignal:
		fd, sig, info, flags := int32(a[0]), int32(a[1]), a[2], uint32(a[3])
		if flags&pidfdSignalProcessGroup != 0 {
			// The target's process group may hold siblings' processes.
			return deny(unix.EPERM, "pidfd_send_signal: PIDFD_SIGNAL_PROCESS_GROUP")
		}
		if fd == pidfdSelfThread || fd == pidfdSelfThreadGroup {
			return allow("pidfd_send_signal: PIDFD_SELF")
		}
		if fd < 0 {
			return deny(unix.EBADF, "pidfd_send_signal: fd < 0")
		}
		if info != 0 && r.arch != auditArchX8664 {
			return deny(unix.EPERM, "pidfd_send_signal: siginfo from a 32-bit caller")
		}
		return verdict{kind: vPidfdSendSignal, fd: int(fd), sig: int(sig), info: info, flags: flags}
	case opPidfdGetfd:
		fd, targetFD, flags := int32(a[0]), int32(a[1]), uint32(a[2])
		if flags != 0 {
			return deny(unix.EINVAL, "pidfd_getfd: flags")
		}
		if fd == pidfdSelfThread || fd == pidfdSelfThreadGroup {
			return allow("pidfd_getfd: PIDFD_SELF")
		}
		if fd < 0 {
			return deny(unix.EBADF, "pidfd_getfd: fd < 0")
		}
		return verdict{kind: vPidfdGetfd, fd: int(fd), targetFD: int(targetFD)}
	case opProcessMadvise:
		fd := int32(a[0])
		if fd == pidfdSelfThread || fd == pidfdSelfThreadGroup {
			return allow("process_madvise: PIDFD_SELF")
		}
		if fd < 0 {
			return deny(unix.EBADF, "process_madvise: fd < 0")
		}
		return s.judgeCallerPidfd(r.caller, callerKey, int(fd), unix.EBADF)
	case opSetns:
		return s.decideSetns(r, callerKey)
	case opSetgid:
		return s.decideGids(r.caller, callerKey, a[:1])
	case opSetregid:
		return s.decideGids(r.caller, callerKey, a[:2])
	case opSetresgid:
		return s.decideGids(r.caller, callerKey, a[:3])
	case opSchedPid:
		return s.judgeSchedTarget(r.caller, callerKey, int32(a[0]), unix.EINVAL)
	case opWhichWho:
		return s.judgeSchedTarget(r.caller, callerKey, int32(a[1]), unix.ESRCH)
	}
	return deny(unix.EPERM, "unknown syscall "+r.op.String())
}

// decideGids judges a change of group ids that names a sandbox group (the filter sends only those): every gid
// from SandboxGIDBase up (but -1, unchanged) must be the caller's own sandbox's, SandboxGIDBase plus the pid of
// an agent (a protected process) in the caller's sandbox. Taking a sibling's group would give its processes'
// credentials, which is all the kernel asks of a same-uid caller to open their /proc/<pid>/mem.
func (s *Supervisor) decideGids(caller int, callerKey string, gids []uint64) verdict {
	for _, g := range gids {
		gid := uint32(g) // gid_t: the kernel uses the low 32 bits
		if gid < SandboxGIDBase || gid == math.MaxUint32 {
			continue
		}
		agent := int(gid - SandboxGIDBase)
		if agent <= 1 || s.guard == nil || !s.guard.Protected(agent) {
			return deny(unix.EPERM, "gid "+strconv.FormatUint(uint64(gid), 10)+" is not a sandbox's group")
		}
		key, err := s.sandboxKey(agent)
		if err != nil || key != callerKey {
			return deny(unix.EPERM, "gid "+strconv.FormatUint(uint64(gid), 10)+" is another sandbox's group")
		}
	}
	return allow("own sandbox's group")
}

// judgeSchedTarget judges a scheduling call aimed at pid (the filter sends only pid != 0): a negative pid gets
// what the kernel answers (negErrno: EINVAL for sched_*, ESRCH for setpriority and ioprio_set); otherwise the
// target must be in the caller's sandbox.
func (s *Supervisor) judgeSchedTarget(caller int, callerKey string, pid int32, negErrno unix.Errno) verdict {
	if pid < 0 {
		return deny(negErrno, "scheduling call: pid < 0")
	}
	if pid == 0 {
		return allow("the caller itself")
	}
	return s.judgePid(caller, callerKey, int(pid))
}

// judgePid allows a call of caller (a tid) whose target is pid when pid is in the sandbox callerKey and is not
// one of ramify's own processes (unless it is the caller's own process: a process may signal its own threads).
func (s *Supervisor) judgePid(caller int, callerKey string, pid int) verdict {
	key, err := s.sandboxKey(pid)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return deny(unix.ESRCH, "target "+strconv.Itoa(pid)+" does not exist")
		}
		return deny(unix.EPERM, "target: "+err.Error())
	}
	if key != callerKey {
		return deny(unix.EPERM, "target "+strconv.Itoa(pid)+" is in another sandbox")
	}
	if s.protected(pid) && !s.sameProcess(caller, pid) {
		return deny(unix.EPERM, "target "+strconv.Itoa(pid)+" is ramify's own process")
	}
	return allow("target " + strconv.Itoa(pid) + " in sandbox")
}

// judgePidfdTarget judges the process a pidfd designates, given the pid read from its fdinfo.
func (s *Supervisor) judgePidfdTarget(caller int, callerKey string, pid int) verdict {
	switch {
	case pid == -1:
		return deny(unix.ESRCH, "pidfd: process exited")
	case pid <= 0:
		return deny(unix.EPERM, "pidfd: process outside this PID namespace")
	}
	return s.judgePid(caller, callerKey, pid)
}

// judgeCallerPidfd judges the process that the caller's fd designates; notPidfd is the answer for an fd that is open
// but is not a pidfd.
func (s *Supervisor) judgeCallerPidfd(caller int, callerKey string, fd int, notPidfd unix.Errno) verdict {
	link, err := os.Readlink(s.procPath(caller, "fd", strconv.Itoa(fd)))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return deny(unix.EBADF, "fd "+strconv.Itoa(fd)+" not open")
		}
		return deny(unix.EPERM, "read fd link: "+err.Error())
	}
	if !isPidfdLink(link) {
		return deny(notPidfd, "fd "+strconv.Itoa(fd)+" is not a pidfd: "+link)
	}
	pid, err := pidfdTarget(s.procPath(caller, "fdinfo", strconv.Itoa(fd)))
	if err != nil {
		return deny(unix.EPERM, err.Error())
	}
	return s.judgePidfdTarget(caller, callerKey, pid)
}

// nsFiles lists, for each namespace type as it appears in an nsfs link ("net:[4026531840]"), the /proc/<pid>/ns
// entries through which a process can be in (or about to create children in) such a namespace.
var nsFiles = map[string][]string{
	"cgroup": {"cgroup"},
	"ipc":    {"ipc"},
	"mnt":    {"mnt"},
	"net":    {"net"},
	"pid":    {"pid", "pid_for_children"},
	"time":   {"time", "time_for_children"},
	"user":   {"user"},
	"uts":    {"uts"},
}

// decideSetns allows setns(fd) when fd is a pidfd of a process of the caller's sandbox, or a namespace that some
// process of the caller's sandbox is in.
func (s *Supervisor) decideSetns(r request, callerKey string) verdict {
	fd := int32(r.args[0])
	if fd < 0 {
		return deny(unix.EBADF, "setns: fd < 0")
	}
	link, err := os.Readlink(s.procPath(r.caller, "fd", strconv.Itoa(int(fd))))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return deny(unix.EBADF, "setns: fd not open")
		}
		return deny(unix.EPERM, "setns: read fd link: "+err.Error())
	}
	if isPidfdLink(link) {
		return s.judgeCallerPidfd(r.caller, callerKey, int(fd), unix.EINVAL)
	}
	typ, rest, ok := strings.Cut(link, ":[")
	if !ok || !strings.HasSuffix(rest, "]") {
		if strings.HasPrefix(link, "/") {
			return deny(unix.EINVAL, "setns: not a namespace: "+link)
		}
		return deny(unix.EPERM, "setns: unrecognized fd: "+link)
	}
	files, ok := nsFiles[typ]
	if !ok {
		return deny(unix.EPERM, "setns: unknown namespace type: "+link)
	}
	// The agent holding the namespace first: a forked interpreter joining its new sandbox asks four times, and
	// finding the agent costs one /proc read where a scan of the family's processes costs one per process.
	if s.guard != nil {
		for _, p := range s.guard.Holders(link) {
			if key, err := s.sandboxKey(p); err == nil && key == callerKey {
				return allow("setns: " + link + " held by agent " + strconv.Itoa(p) + " of the sandbox")
			}
		}
	}
	pids, err := s.listPids()
	if err != nil {
		return deny(unix.EPERM, "setns: "+err.Error())
	}
	for _, p := range pids {
		key, err := s.sandboxKey(p)
		if err != nil || key != callerKey {
			continue
		}
		if s.guard != nil {
			for _, l := range s.guard.Namespaces(p) {
				if l == link {
					return allow("setns: " + link + " held by agent " + strconv.Itoa(p) + " of the sandbox")
				}
			}
		}
		for _, f := range files {
			if l, err := os.Readlink(s.procPath(p, "ns", f)); err == nil && l == link {
				return allow("setns: " + link + " held by " + strconv.Itoa(p) + " of the sandbox")
			}
		}
	}
	return deny(unix.EPERM, "setns: no process of the sandbox is in "+link)
}

// decideKillGroup decides kill(pid <= 0, sig): the processes of the caller's sandbox that the call designates.
func (s *Supervisor) decideKillGroup(r request, callerKey string, pid, sig int32) verdict {
	if sig < 0 || sig > 64 { // _NSIG
		return deny(unix.EINVAL, "kill: invalid signal")
	}
	if pid == math.MinInt32 {
		return deny(unix.ESRCH, "kill: INT_MIN") // as the kernel does
	}
	callerTgid, err := s.threadGroup(r.caller)
	if err != nil {
		return deny(unix.EPERM, "kill: caller: "+err.Error())
	}
	pgrp := 0
	switch {
	case pid == 0:
		if pgrp, err = s.processGroup(r.caller); err != nil {
			return deny(unix.EPERM, "kill: caller: "+err.Error())
		}
	case pid < -1:
		pgrp = int(-pid)
	}
	pids, err := s.listPids()
	if err != nil {
		return deny(unix.EPERM, "kill: "+err.Error())
	}
	v := verdict{kind: vKillGroup, sig: int(sig), pgrp: pgrp, callerTgid: callerTgid}
	for _, p := range pids {
		if pgrp == 0 && (p == 1 || p == callerTgid) {
			continue // kill(-1) spares init and the caller
		}
		key, err := s.sandboxKey(p)
		if err != nil || key != callerKey || (s.guard != nil && s.guard.Protected(p)) {
			continue // kill(-1) and process-group kills never reach ramify's own processes
		}
		if pgrp != 0 {
			if g, err := s.processGroup(p); err != nil || g != pgrp {
				continue
			}
		}
		if p == callerTgid {
			v.includeCaller = true
			continue
		}
		v.targets = append(v.targets, p)
	}
	return v
}
