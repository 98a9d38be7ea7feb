package agent

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// procTree keeps track of every process an exec's command started, so that a timeout (or a cancelled call) can
// kill all of them: the command's process group, its descendants, and processes that left both (setsid) or were
// orphaned (their parent exited, so they are nobody's descendant any more) after the tracker saw them.
//
// Why not a child subreaper (PR_SET_CHILD_SUBREAPER on the agent): it keeps orphans under the agent, but does
// not say which exec they came from (orphans of concurrent execs and of the interpreter's subprocesses all land
// on the agent alike), and it makes the agent reap orphans, which races with os/exec's own wait for the
// commands' exit statuses. Attribution is what a timeout needs, so the tracker records it while it can still be
// seen: a process belongs to the command if it is the command, is in its process group, is a child of a process
// that belongs to it, or leads or is in a session (setsid) of one. Each is remembered by pid and start time, so a
// reused pid is never mistaken for it. Scans run right after the start and then at growing intervals (up to
// trackMaxInterval), and once more at the kill. What scans cannot see: a process that leaves the process group
// and whose parent exits, both between two scans (a double fork done within microseconds, as daemons do). For
// those, the command's environment carries a marker (ExecIDEnv, a random token per call), inherited by what it
// starts, and the kill also takes every process started since the command whose environment holds it (as
// Jenkins's ProcessTreeKiller does with its cookie). Only a process that both escapes the scans and clears its
// environment (env -i) is out of reach.
type procTree struct {
	proc   string // the /proc to read
	root   int    // the command's pid, and its process group
	marker []byte // "\x00" + ExecIDEnv + "=" + token + "\x00", or nil

	mu    sync.Mutex
	known map[int]uint64 // pid -> start time (clock ticks since boot)
}

// trackMaxInterval is the longest time between two scans. Scans read every process of the family (whose PID
// namespace siblings share), about 12 µs each; the marker finds what slips between them, so they can be rare.
const trackMaxInterval = time.Second

// ExecIDEnv names the environment variable that marks the processes of one exec call (see procTree).
const ExecIDEnv = "RAMIFY_EXEC_ID"

// newProcTree tracks the processes of the command with pid root; token, if not empty, is the value of ExecIDEnv
// in its environment. The root is known from the start (when its stat can be read: it is not reaped before its
// caller waits for it), so that a kill before the first scan still finds what carries the marker: the marker
// search takes processes started no earlier than the root.
func newProcTree(proc string, root int, token string) *procTree {
	t := &procTree{proc: proc, root: root, known: map[int]uint64{}}
	if token != "" {
		t.marker = []byte("\x00" + ExecIDEnv + "=" + token + "\x00")
	}
	if p, ok := t.readStat(root); ok {
		t.known[root] = p.start
	}
	return t
}

// procStat is what the tracker reads of one process's /proc/<pid>/stat.
type procStat struct {
	pid, ppid, pgrp, session int
	state                    byte
	start                    uint64
}

// parseStat parses /proc/<pid>/stat (the command name may hold spaces and parentheses: fields are counted from
// the last ')').
func parseStat(pid int, b []byte) (procStat, bool) {
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return procStat{}, false
	}
	f := strings.Fields(s[i+2:])
	// f[0] state, f[1] ppid, f[2] pgrp, f[3] session, ..., f[19] starttime
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, false
	}
	ppid, e1 := strconv.Atoi(f[1])
	pgrp, e2 := strconv.Atoi(f[2])
	sess, e3 := strconv.Atoi(f[3])
	start, e4 := strconv.ParseUint(f[19], 10, 64)
	if e1 != nil || e2 != nil || e3 != nil || e4 != nil {
		return procStat{}, false
	}
	return procStat{pid: pid, ppid: ppid, pgrp: pgrp, session: sess, state: f[0][0], start: start}, true
}

// readStat reads one process's stat with plain system calls (a third of os.ReadFile's cost, which matters for a
// scan of every process of the family).
func (t *procTree) readStat(pid int) (procStat, bool) {
	fd, err := unix.Open(t.proc+"/"+strconv.Itoa(pid)+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return procStat{}, false
	}
	defer unix.Close(fd)
	var buf [1024]byte
	n, err := unix.Read(fd, buf[:])
	if err != nil || n <= 0 {
		return procStat{}, false
	}
	return parseStat(pid, buf[:n])
}

// snapshot reads every process's stat.
func (t *procTree) snapshot() []procStat {
	d, err := os.Open(t.proc)
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	out := make([]procStat, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if st, ok := t.readStat(pid); ok {
			out = append(out, st)
		}
	}
	return out
}

// scan records the command's processes among those running now and returns the live ones (not zombies).
func (t *procTree) scan() []procStat {
	return t.attribute(t.snapshot())
}

// attribute adds to the known set the processes of procs that belong to the command and returns those alive.
func (t *procTree) attribute(procs []procStat) []procStat {
	t.mu.Lock()
	defer t.mu.Unlock()
	// A process is known if its pid was recorded with the same start time.
	isKnown := func(pid int, start uint64) bool { s, ok := t.known[pid]; return ok && s == start }
	byPid := make(map[int]procStat, len(procs))
	for _, p := range procs {
		byPid[p.pid] = p
	}
	// knownLive: pid -> whether the known process with that pid is the one now running under it (a parent or
	// session leader is judged by its identity, never by a reused pid).
	knownLive := func(pid int) bool {
		p, ok := byPid[pid]
		return ok && isKnown(pid, p.start)
	}
	self := os.Getpid()
	mine := make(map[int]bool, len(procs))
	for changed := true; changed; {
		changed = false
		for _, p := range procs {
			if mine[p.pid] || p.pid == self {
				continue
			}
			if p.pid == t.root || p.pgrp == t.root || isKnown(p.pid, p.start) || knownLive(p.ppid) ||
				(mine[p.ppid] && p.ppid != 0) || knownLive(p.session) || mine[p.session] || t.orphanOfSession(p) {
				mine[p.pid] = true
				t.known[p.pid] = p.start
				changed = true
			}
		}
	}
	var live []procStat
	for _, p := range procs {
		if mine[p.pid] && p.state != 'Z' && p.state != 'X' {
			live = append(live, p)
		}
	}
	return live
}

// orphanOfSession reports whether p is in a session whose leader the tracker saw as the command's and which has
// exited since: its members are the command's even when their parent is gone. Called with t.mu held.
func (t *procTree) orphanOfSession(p procStat) bool {
	if p.session == p.pid {
		return false
	}
	_, ok := t.known[p.session]
	if !ok {
		return false
	}
	// The recorded leader must be gone (not replaced by an unrelated process with its pid).
	if _, alive := t.readStat(p.session); alive {
		return false
	}
	return true
}

// track scans in the background until stop is called: often right after the start, when most processes are
// made, then every trackMaxInterval.
func (t *procTree) track() (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		// The first look after 5 ms: a command that ends sooner (most do) pays nothing; what one double-forks away
		// before then still carries the call's token, which the kill finds.
		interval := 5 * time.Millisecond
		timer := time.NewTimer(interval)
		defer timer.Stop()
		for {
			select {
			case <-done:
				return
			case <-timer.C:
			}
			t.scan()
			timer.Reset(interval)
			if interval *= 2; interval > trackMaxInterval {
				interval = trackMaxInterval
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			<-finished
		})
	}
}

// kill sends SIGKILL to every process of the command, scanning again until none is left (a process may have
// forked while it was being killed). Each is signalled through a pidfd opened before its identity is checked
// again, so a pid reused in between is never hit.
func (t *procTree) kill() {
	syscall.Kill(-t.root, syscall.SIGKILL)
	began := time.Now()
	for round := 0; round < 50; round++ {
		procs := t.snapshot()
		live := t.attribute(procs)
		marked, unsure := t.marked(procs)
		live = append(live, marked...)
		if len(live) == 0 {
			// A process caught in execve shows an empty environment for a moment: look at it again before
			// leaving it alive (one whose environment is empty for good is left after unsureFor).
			if !unsure || time.Since(began) > unsureFor {
				return
			}
		}
		for _, p := range live {
			t.killOne(p)
		}
		syscall.Kill(-t.root, syscall.SIGKILL)
		time.Sleep(time.Duration(round+1) * time.Millisecond)
	}
}

// unsureFor is how long a kill keeps looking at processes whose environment reads empty.
const unsureFor = 100 * time.Millisecond

// marked returns the live processes of procs not yet attributed, started no earlier than the command, whose
// environment holds the command's marker, and records them as the command's. unsure reports a candidate whose
// environment read empty: between execve's switch to the new program's memory and the kernel's recording of its
// environment there, /proc/<pid>/environ shows nothing, so a process of the command caught in that moment (a
// setsid'd child exec'ing its program as the kill comes) would be left alive if taken at its word.
func (t *procTree) marked(procs []procStat) (out []procStat, unsure bool) {
	if t.marker == nil {
		return nil, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	since, ok := t.known[t.root]
	if !ok {
		return nil, false
	}
	self := os.Getpid()
	// Only this sandbox's processes (the agent's cgroup): the family's PID namespace shows its siblings' too,
	// whose environments are none of this agent's business.
	own := t.readFile(self, "cgroup", 64<<10)
	for _, p := range procs {
		if s, ok := t.known[p.pid]; (ok && s == p.start) || p.pid == self || p.start < since || p.state == 'Z' || p.state == 'X' {
			continue
		}
		if own == nil || !bytes.Equal(t.readFile(p.pid, "cgroup", 64<<10), own) {
			continue
		}
		switch env := t.readFile(p.pid, "environ", 4<<20); {
		case len(env) == 0:
			unsure = unsure || env != nil
		case hasMarker(env, t.marker):
			t.known[p.pid] = p.start
			out = append(out, p)
		}
	}
	return out, unsure
}

// hasMarker reports whether a process's environment (as /proc/<pid>/environ shows it) holds the marker.
func hasMarker(env, marker []byte) bool {
	return bytes.Contains(append(append([]byte{0}, env...), 0), marker)
}

// readFile reads up to limit bytes of /proc/<pid>/<name> (nil if it cannot).
func (t *procTree) readFile(pid int, name string, limit int) []byte {
	fd, err := unix.Open(t.proc+"/"+strconv.Itoa(pid)+"/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	out := []byte{}
	buf := make([]byte, 16<<10)
	for len(out) < limit {
		n, err := unix.Read(fd, buf)
		if err != nil {
			return nil
		}
		if n <= 0 {
			break
		}
		out = append(out, buf[:n]...)
	}
	return out
}

func (t *procTree) killOne(p procStat) {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			syscall.Kill(p.pid, syscall.SIGKILL)
		}
		return
	}
	defer unix.Close(fd)
	if now, ok := t.readStat(p.pid); !ok || now.start != p.start {
		return
	}
	unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) //nolint:errcheck // gone already
}
