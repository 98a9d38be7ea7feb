//go:build linux

package seccomp

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeProc builds a /proc-like tree for the decision function.
type fakeProc struct {
	t    *testing.T
	root string
}

func (f *fakeProc) write(rel, content string) {
	f.t.Helper()
	p := filepath.Join(f.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeProc) link(rel, target string) {
	f.t.Helper()
	p := filepath.Join(f.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		f.t.Fatal(err)
	}
}

// process adds a thread-group leader in cgroup sandbox (v1 layout) and process group pgrp.
func (f *fakeProc) process(pid int, sandbox string, pgrp int, netns string) {
	d := strconv.Itoa(pid)
	f.write(d+"/cgroup", fmt.Sprintf("12:memory:/other\n5:pids:/ramify/fam/%s\n1:name=systemd:/\n0::/\n", sandbox))
	f.write(d+"/stat", fmt.Sprintf("%d (a (weird) name) S 1 %d %d 0 -1 4194560 0 0\n", pid, pgrp, pgrp))
	f.write(d+"/status", fmt.Sprintf("Name:\tx\nTgid:\t%d\nPid:\t%d\n", pid, pid))
	f.write(d+"/task/"+d+"/stat", "")
	f.link(d+"/ns/net", netns)
	f.link(d+"/ns/pid", "pid:[4026531836]")
	f.link(d+"/ns/pid_for_children", "pid:[4026531836]")
}

func (f *fakeProc) pidfd(pid, fd, target int) {
	f.link(fmt.Sprintf("%d/fd/%d", pid, fd), "anon_inode:[pidfd]")
	f.write(fmt.Sprintf("%d/fdinfo/%d", pid, fd), fmt.Sprintf("pos:\t0\nflags:\t02000002\nmnt_id:\t15\nPid:\t%d\nNSpid:\t%d\n", target, target))
}

func newFixture(t *testing.T) *Supervisor {
	f := &fakeProc{t: t, root: t.TempDir()}
	// Sandbox A: 1 (init, spared by kill(-1)), 100 (the caller, pgrp 100, threads 100 and 101), 200 (pgrp 100),
	// 201 (pgrp 201, in a new pid namespace for its children). Sandbox B: 300 (pgrp 100), 301 (pgrp 301).
	f.process(1, "A", 1, "net:[111]")
	f.process(100, "A", 100, "net:[111]")
	f.write("100/task/101/stat", "")
	f.process(200, "A", 100, "net:[111]")
	f.process(201, "A", 201, "net:[111]")
	if err := os.Remove(filepath.Join(f.root, "201/ns/pid_for_children")); err != nil {
		t.Fatal(err)
	}
	f.link("201/ns/pid_for_children", "pid:[333]")
	f.process(300, "B", 100, "net:[222]")
	f.process(301, "B", 301, "net:[222]")
	f.write("self", "not a number: ignored")
	f.pidfd(100, 3, 200)
	f.pidfd(100, 4, 300)
	f.pidfd(100, 5, -1)
	f.pidfd(100, 11, 0)
	f.link("100/fd/6", "net:[111]")
	f.link("100/fd/7", "net:[222]")
	f.link("100/fd/8", "/etc/passwd")
	f.link("100/fd/9", "pid:[333]")
	f.link("100/fd/10", "/proc/300")
	f.write("100/fdinfo/10", "pos:\t0\nflags:\t02300000\nmnt_id:\t21\nino:\t1\n")
	f.link("100/fd/12", "weird:[1]")
	return NewSupervisor(f.root, nil)
}

func u(v int64) uint64 { return uint64(v) }

func TestDecide(t *testing.T) {
	s := newFixture(t)
	const x86, i386 = auditArchX8664, auditArchI386
	cases := []struct {
		name     string
		caller   int
		arch     uint32
		op       op
		args     []uint64
		kind     verdictKind
		errno    unix.Errno
		targets  []int
		pgrp     int
		inclCall bool
		pidfdFD  int
	}{
		{name: "kill same sandbox", op: opKill, args: []uint64{200, 9}, kind: vContinue},
		{name: "kill self", op: opKill, args: []uint64{100, 0}, kind: vContinue},
		{name: "kill sibling", op: opKill, args: []uint64{300, 9}, kind: vErrno, errno: unix.EPERM},
		{name: "kill missing", op: opKill, args: []uint64{999, 9}, kind: vErrno, errno: unix.ESRCH},
		{name: "kill caller vanished", caller: 555, op: opKill, args: []uint64{200, 9}, kind: vErrno, errno: unix.EPERM},
		{name: "kill 0", op: opKill, args: []uint64{0, 15}, kind: vKillGroup, targets: []int{200}, pgrp: 100, inclCall: true},
		{name: "kill -1", op: opKill, args: []uint64{u(-1), 9}, kind: vKillGroup, targets: []int{200, 201}},
		{name: "kill -1 i386 (32-bit arg)", arch: i386, op: opKill, args: []uint64{0xffffffff, 9}, kind: vKillGroup, targets: []int{200, 201}},
		{name: "kill -1 upper bits ignored", op: opKill, args: []uint64{0x12345678ffffffff, 9}, kind: vKillGroup, targets: []int{200, 201}},
		{name: "kill -pgrp", op: opKill, args: []uint64{u(-201), 9}, kind: vKillGroup, targets: []int{201}, pgrp: 201},
		{name: "kill -own pgrp", op: opKill, args: []uint64{u(-100), 9}, kind: vKillGroup, targets: []int{200}, pgrp: 100, inclCall: true},
		{name: "kill -sibling pgrp", op: opKill, args: []uint64{u(-301), 9}, kind: vKillGroup, pgrp: 301},
		{name: "kill 0 bad signal", op: opKill, args: []uint64{0, 65}, kind: vErrno, errno: unix.EINVAL},
		{name: "kill INT_MIN", op: opKill, args: []uint64{0x80000000, 9}, kind: vErrno, errno: unix.ESRCH},
		{name: "tkill same", op: opTkill, args: []uint64{200, 9}, kind: vContinue},
		{name: "tkill sibling", op: opTkill, args: []uint64{300, 9}, kind: vErrno, errno: unix.EPERM},
		{name: "tkill 0", op: opTkill, args: []uint64{0, 9}, kind: vErrno, errno: unix.EINVAL},
		{name: "tgkill own thread", op: opTgkill, args: []uint64{100, 101, 0}, kind: vContinue},
		{name: "tgkill tid of another group", op: opTgkill, args: []uint64{100, 300, 0}, kind: vErrno, errno: unix.ESRCH},
		{name: "tgkill sibling", op: opTgkill, args: []uint64{300, 300, 9}, kind: vErrno, errno: unix.EPERM},
		{name: "rt_tgsigqueueinfo sibling", op: opRtTgsigqueueinfo, args: []uint64{301, 301, 9, 0}, kind: vErrno, errno: unix.EPERM},
		{name: "rt_sigqueueinfo same", op: opRtSigqueueinfo, args: []uint64{201, 10, 0}, kind: vContinue},
		{name: "rt_sigqueueinfo sibling", op: opRtSigqueueinfo, args: []uint64{300, 10, 0}, kind: vErrno, errno: unix.EPERM},
		{name: "rt_sigqueueinfo -1", op: opRtSigqueueinfo, args: []uint64{u(-1), 10, 0}, kind: vErrno, errno: unix.ESRCH},
		{name: "ptrace traceme", op: opPtrace, args: []uint64{0, 300}, kind: vContinue},
		{name: "ptrace attach sibling", op: opPtrace, args: []uint64{unix.PTRACE_ATTACH, 300}, kind: vErrno, errno: unix.EPERM},
		{name: "ptrace seize same", op: opPtrace, args: []uint64{unix.PTRACE_SEIZE, 200}, kind: vContinue},
		{name: "ptrace request with upper bits is not traceme", op: opPtrace, args: []uint64{1 << 32, 300}, kind: vErrno, errno: unix.EPERM},
		{name: "process_vm_readv sibling", op: opProcessVMReadv, args: []uint64{300}, kind: vErrno, errno: unix.EPERM},
		{name: "process_vm_writev same", op: opProcessVMWritev, args: []uint64{200}, kind: vContinue},
		{name: "pidfd_open same", op: opPidfdOpen, args: []uint64{200, 0}, kind: vContinue},
		{name: "pidfd_open sibling", op: opPidfdOpen, args: []uint64{300, 0}, kind: vErrno, errno: unix.EPERM},
		{name: "pidfd_open 0", op: opPidfdOpen, args: []uint64{0, 0}, kind: vErrno, errno: unix.EINVAL},
		{name: "kcmp same", op: opKcmp, args: []uint64{100, 200, 0}, kind: vContinue},
		{name: "kcmp one sibling", op: opKcmp, args: []uint64{100, 300, 0}, kind: vErrno, errno: unix.EPERM},
		{name: "pidfd_send_signal emulated", op: opPidfdSendSignal, args: []uint64{3, 9, 0, 0}, kind: vPidfdSendSignal, pidfdFD: 3},
		{name: "pidfd_send_signal process group", op: opPidfdSendSignal, args: []uint64{3, 9, 0, 4}, kind: vErrno, errno: unix.EPERM},
		{name: "pidfd_send_signal self", op: opPidfdSendSignal, args: []uint64{u(pidfdSelfThreadGroup), 9, 0, 0}, kind: vContinue},
		{name: "pidfd_send_signal self process group", op: opPidfdSendSignal, args: []uint64{u(pidfdSelfThread), 9, 0, 4}, kind: vErrno, errno: unix.EPERM},
		{name: "pidfd_send_signal bad fd", op: opPidfdSendSignal, args: []uint64{u(-1), 9, 0, 0}, kind: vErrno, errno: unix.EBADF},
		{name: "pidfd_send_signal i386 siginfo", arch: i386, op: opPidfdSendSignal, args: []uint64{3, 9, 0x1000, 0}, kind: vErrno, errno: unix.EPERM},
		{name: "pidfd_getfd emulated", op: opPidfdGetfd, args: []uint64{4, 1, 0}, kind: vPidfdGetfd, pidfdFD: 4},
		{name: "pidfd_getfd flags", op: opPidfdGetfd, args: []uint64{3, 1, 1}, kind: vErrno, errno: unix.EINVAL},
		{name: "process_madvise same", op: opProcessMadvise, args: []uint64{3, 0, 0, 20, 0}, kind: vContinue},
		{name: "process_madvise sibling", op: opProcessMadvise, args: []uint64{4, 0, 0, 20, 0}, kind: vErrno, errno: unix.EPERM},
		{name: "process_madvise exited", op: opProcessMadvise, args: []uint64{5, 0, 0, 20, 0}, kind: vErrno, errno: unix.ESRCH},
		{name: "process_madvise other pid ns", op: opProcessMadvise, args: []uint64{11, 0, 0, 20, 0}, kind: vErrno, errno: unix.EPERM},
		{name: "process_madvise not a pidfd", op: opProcessMadvise, args: []uint64{8, 0, 0, 20, 0}, kind: vErrno, errno: unix.EBADF},
		{name: "process_madvise fd not open", op: opProcessMadvise, args: []uint64{42, 0, 0, 20, 0}, kind: vErrno, errno: unix.EBADF},
		{name: "setns own net", op: opSetns, args: []uint64{6, unix.CLONE_NEWNET}, kind: vContinue},
		{name: "setns sibling net", op: opSetns, args: []uint64{7, unix.CLONE_NEWNET}, kind: vErrno, errno: unix.EPERM},
		{name: "setns pid_for_children of a sandbox process", op: opSetns, args: []uint64{9, 0}, kind: vContinue},
		{name: "setns regular file", op: opSetns, args: []uint64{8, 0}, kind: vErrno, errno: unix.EINVAL},
		{name: "setns proc dir", op: opSetns, args: []uint64{10, 0}, kind: vErrno, errno: unix.EINVAL},
		{name: "setns unknown link", op: opSetns, args: []uint64{12, 0}, kind: vErrno, errno: unix.EPERM},
		{name: "setns pidfd same", op: opSetns, args: []uint64{3, unix.CLONE_NEWNET}, kind: vContinue},
		{name: "setns pidfd sibling", op: opSetns, args: []uint64{4, unix.CLONE_NEWNET}, kind: vErrno, errno: unix.EPERM},
		{name: "setns fd not open", op: opSetns, args: []uint64{42, 0}, kind: vErrno, errno: unix.EBADF},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := request{caller: 100, arch: x86, op: c.op}
			if c.caller != 0 {
				r.caller = c.caller
			}
			if c.arch != 0 {
				r.arch = c.arch
			}
			copy(r.args[:], c.args)
			v := s.decide(r)
			if v.kind != c.kind || v.errno != c.errno {
				t.Fatalf("verdict %s errno %v (%s), want %s errno %v", v.kind, v.errno, v.reason, c.kind, c.errno)
			}
			if v.kind == vKillGroup {
				if !slices.Equal(v.targets, c.targets) || v.pgrp != c.pgrp || v.includeCaller != c.inclCall || v.callerTgid != 100 {
					t.Fatalf("kill group: targets %v pgrp %d includeCaller %v callerTgid %d, want %v %d %v 100",
						v.targets, v.pgrp, v.includeCaller, v.callerTgid, c.targets, c.pgrp, c.inclCall)
				}
			}
			if (v.kind == vPidfdSendSignal || v.kind == vPidfdGetfd) && v.fd != c.pidfdFD {
				t.Fatalf("pidfd verdict for fd %d, want %d", v.fd, c.pidfdFD)
			}
		})
	}
}

func TestCgroupKey(t *testing.T) {
	cases := []struct{ in, want string }{
		{"12:memory:/m\n5:pids:/ramify/ab/sbx_1\n0::/\n", "pids:/ramify/ab/sbx_1"},
		{"3:cpu,pids:/x\n", "pids:/x"},
		{"0::/ramify/ab/sbx_2\n", "0::/ramify/ab/sbx_2"},
		{"1:name=systemd:/a\n", "whole:1:name=systemd:/a\n"},
	}
	for _, c := range cases {
		if got := cgroupKey([]byte(c.in)); got != c.want {
			t.Errorf("cgroupKey(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// guardOf protects the listed thread groups, with the namespaces given.
type guardOf map[int][]string

func (g guardOf) Protected(tgid int) bool      { _, ok := g[tgid]; return ok }
func (g guardOf) Namespaces(tgid int) []string { return g[tgid] }
func (g guardOf) Holders(link string) []int {
	var out []int
	for p, links := range g {
		if slices.Contains(links, link) {
			out = append(out, p)
		}
	}
	return out
}

// With a Guard, ramify's own processes (here 201, standing for an agent, and 1) are never a target, even in the
// caller's sandbox; kill(-1) passes them over; their own calls are trusted; the namespaces they register count
// for setns although their /proc/<pid>/ns cannot be read.
func TestDecideGuard(t *testing.T) {
	s := newFixture(t)
	s.SetGuard(guardOf{1: nil, 201: {"net:[444]"}, 301: {"net:[555]"}})
	f := &fakeProc{t: t, root: s.procRoot}
	f.link("100/fd/13", "net:[444]")
	f.link("100/fd/14", "net:[555]")
	cases := []struct {
		name    string
		caller  int
		op      op
		args    []uint64
		kind    verdictKind
		targets []int
	}{
		{name: "kill agent", op: opKill, args: []uint64{201, 9}, kind: vErrno},
		{name: "tgkill agent", op: opTgkill, args: []uint64{201, 201, 9}, kind: vErrno},
		{name: "ptrace agent", op: opPtrace, args: []uint64{unix.PTRACE_ATTACH, 201}, kind: vErrno},
		{name: "pidfd_open agent", op: opPidfdOpen, args: []uint64{201, 0}, kind: vErrno},
		{name: "process_vm_readv agent", op: opProcessVMReadv, args: []uint64{201}, kind: vErrno},
		{name: "kill -1 spares the agent", op: opKill, args: []uint64{u(-1), 9}, kind: vKillGroup, targets: []int{200}},
		{name: "kill own sandbox's process still allowed", op: opKill, args: []uint64{200, 9}, kind: vContinue},
		{name: "the agent's own calls are trusted", caller: 201, op: opKill, args: []uint64{300, 9}, kind: vContinue},
		{name: "setns into a namespace the agent registered", op: opSetns, args: []uint64{13, 0}, kind: vContinue},
		{name: "setns into a namespace a sibling's agent registered", op: opSetns, args: []uint64{14, 0}, kind: vErrno},
		// Sandbox groups: SandboxGIDBase + the pid of the sandbox's agent (201 in A, 301 in B).
		{name: "sched_setaffinity own process", op: opSchedPid, args: []uint64{200}, kind: vContinue},
		{name: "sched_setaffinity sibling", op: opSchedPid, args: []uint64{300}, kind: vErrno},
		{name: "sched_setattr agent", op: opSchedPid, args: []uint64{201}, kind: vErrno},
		{name: "setpriority own process", op: opWhichWho, args: []uint64{0, 200, 19}, kind: vContinue},
		{name: "setpriority sibling", op: opWhichWho, args: []uint64{0, 301, 19}, kind: vErrno},
		{name: "ioprio_set sibling", op: opWhichWho, args: []uint64{1, 300, 0}, kind: vErrno},
		{name: "setgid own sandbox's group", op: opSetgid, args: []uint64{SandboxGIDBase + 201}, kind: vContinue},
		{name: "setresgid own group, all three", op: opSetresgid, args: []uint64{SandboxGIDBase + 201, SandboxGIDBase + 201, SandboxGIDBase + 201}, kind: vContinue},
		{name: "setregid -1 and own group", op: opSetregid, args: []uint64{0xffffffff, SandboxGIDBase + 201}, kind: vContinue},
		{name: "setgid own group, high word ignored", op: opSetgid, args: []uint64{1<<32 | (SandboxGIDBase + 201)}, kind: vContinue},
		{name: "setgid a sibling's group", op: opSetgid, args: []uint64{SandboxGIDBase + 301}, kind: vErrno},
		{name: "setresgid a sibling's group as saved gid", op: opSetresgid, args: []uint64{0, 0xffffffff, SandboxGIDBase + 301}, kind: vErrno},
		{name: "setregid own then sibling's", op: opSetregid, args: []uint64{SandboxGIDBase + 201, SandboxGIDBase + 301}, kind: vErrno},
		{name: "setgid group of a process that is not an agent", op: opSetgid, args: []uint64{SandboxGIDBase + 200}, kind: vErrno},
		{name: "setgid group of the init", op: opSetgid, args: []uint64{SandboxGIDBase + 1}, kind: vErrno},
		{name: "setgid group of no process", op: opSetgid, args: []uint64{SandboxGIDBase + 999}, kind: vErrno},
		{name: "setgid below the sandbox groups (no check)", op: opSetgid, args: []uint64{1000}, kind: vContinue},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			caller := c.caller
			if caller == 0 {
				caller = 100
			}
			var args [6]uint64
			copy(args[:], c.args)
			v := s.decide(request{caller: caller, arch: auditArchX8664, op: c.op, args: args})
			if v.kind != c.kind || (c.kind == vErrno && v.errno != unix.EPERM) || !slices.Equal(v.targets, c.targets) {
				t.Fatalf("got %v %v targets %v (%s), want %v targets %v", v.kind, v.errno, v.targets, v.reason, c.kind, c.targets)
			}
		})
	}
}
