package namespaces

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/cgroups"
	"github.com/ramify-dev/ramify/internal/network"
	"github.com/ramify-dev/ramify/internal/seccomp"
)

// The family init is PID 1 of a family's PID namespace. It lives in its own user, mount, network, UTS and IPC
// namespaces with a tmpfs root holding only /proc and a few device nodes (nothing of the host), reaps every
// orphan of the family, and spawns sandbox agents on the server's request: the server sends the agent's config
// and the detached mount of its root file system over a SOCK_SEQPACKET abstract socket in the init's network namespace.

const initSocket = "ramify-init"

type initRequest struct {
	Op     string        `json:"op"` // ping, spawn, spares, hold
	Config *agent.Config `json:"config,omitempty"`
	Pid    int           `json:"pid,omitempty"`    // spawn: claim this idle spare (its pid here), or fail
	Fresh  bool          `json:"fresh,omitempty"`  // spawn: start a new agent, idle spares or not
	Count  int           `json:"count,omitempty"`  // spares: how many idle agents to keep ready
	More   int           `json:"more,omitempty"`   // spares: start this many beside those idle (within maxSpares)
	IdleS  float64       `json:"idle_s,omitempty"` // spares: how long an unused spare lives (0: until the family ends)
	HoldS  float64       `json:"hold_s,omitempty"` // hold: how long an init given no work yet waits for some
}

type initReply struct {
	OK      bool   `json:"ok"`
	Pid     int    `json:"pid,omitempty"`
	Spare   bool   `json:"spare,omitempty"`  // spawn: a spare agent took the work
	Spares  []int  `json:"spares,omitempty"` // spares: the idle spares' pids, oldest first
	Message string `json:"message,omitempty"`
}

// maxSpares bounds the idle agents an init keeps.
const maxSpares = 32

// spares are agents started ahead of need (see agent.SpareArg): exec'd and through the Go runtime's start-up,
// each waiting on its claim socket. A spawn hands its config and root mount to one of them, if any, instead of
// starting a process: what a fork of n children would otherwise wait for n times.
var spares struct {
	sync.Mutex
	idle    []spareAgent
	maxIdle time.Duration // how long an unused spare lives (0: for ever)
}

type spareAgent struct {
	pid   int
	claim int // our end of the spare's claim socket
	since time.Time
}

// InitMain is the family init's entry point (`ramify __init`).
func InitMain(args []string) error {
	if os.Getpid() != 1 {
		return errors.New("__init must run as PID 1 of a new PID namespace")
	}
	if err := agent.HardenSelf(3); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	supervisor.SetGuard(ramifyProcs)
	if err := initRoot(); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	// The machinery's deny-list, on every thread of the init and inherited by every agent it starts.
	if err := seccomp.InstallMachineryFilter(); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: "@" + initSocket, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("init: listen: %w", err)
	}
	go reapForever()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return err
		}
		go serveInit(c)
	}
}

func initRoot() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	stage := "/mnt"
	if _, err := os.Stat(stage); err != nil {
		stage = "/tmp"
	}
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	for _, d := range []string{"dev", "proc", "mnt"} {
		if err := os.Mkdir(filepath.Join(stage, d), 0o755); err != nil {
			return err
		}
	}
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		target := filepath.Join(stage, "dev", n)
		f, err := os.Create(target)
		if err != nil {
			return err
		}
		f.Close()
		if err := unix.Mount("/dev/"+n, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", n, err)
		}
	}
	if err := unix.Mount("proc", filepath.Join(stage, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	// A sysfs of the init's own network namespace: the kernel lets a user namespace mount sysfs only where one is
	// already fully visible in its mount namespace, and each agent mounts its sandbox's /sys in a copy of this one.
	if err := os.Mkdir(filepath.Join(stage, "sys"), 0o755); err != nil {
		return err
	}
	if err := unix.Mount("sysfs", filepath.Join(stage, "sys"), "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount sysfs: %w", err)
	}
	if err := os.Chdir(stage); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return os.Chdir("/")
}

// spawned is set once the init has given a sandbox an agent (started one for it, or handed it a spare): from then
// on, a family with no sandbox left ends its init.
var spawned atomic.Bool

var started = time.Now()

// idleInitLimit is how long an init that never spawned an agent waits before it exits, unless held longer.
const idleInitLimit = 60 * time.Second

// heldUntil (unix nanoseconds) extends idleInitLimit for a family started ahead of need (op "hold").
var heldUntil atomic.Int64

// workDeadline is when an init given no work yet gives up (its spares die with it).
func workDeadline() time.Time {
	d := started.Add(idleInitLimit)
	if h := time.Unix(0, heldUntil.Load()); h.After(d) {
		d = h
	}
	return d
}

// reapWake wakes reapForever to recompute when it must next wake up (the spares changed).
var reapWake = make(chan struct{}, 1)

func wakeReaper() {
	select {
	case reapWake <- struct{}{}:
	default:
	}
}

// reapForever reaps the init's children whenever one exits and ends the init once the family's sandboxes are
// gone. It wakes only for a child's exit (SIGCHLD), a change of the spares, or the next deadline (an idle
// spare's retirement, the limit for an init never given work): an idle family costs no CPU, which with a
// thousand families on one host is what lets the host stay responsive.
func reapForever() {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGCHLD)
	for {
		retireIdleSpares()
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if spawned.Load() && !errors.Is(err, unix.ECHILD) && pid == 0 && onlySparesLeft() {
				// Only spares are left: the family's sandboxes are gone. The spares die with this PID 1.
				os.Exit(0)
			}
			if errors.Is(err, unix.ECHILD) && spawned.Load() {
				// Every sandbox of the family is gone: nothing is left to reap.
				os.Exit(0)
			}
			if !spawned.Load() && time.Now().After(workDeadline()) {
				// The server never gave this init work (it died mid-create, or did not need a family started
				// ahead): the init ends, and its spares, if any, with it.
				os.Exit(0)
			}
			if pid <= 0 || err != nil {
				break
			}
			ramifyProcs.forget(pid)
			dropSpare(pid)
		}
		if d := nextReapDeadline(); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ch:
			case <-reapWake:
			case <-t.C:
			}
			t.Stop()
		} else {
			select {
			case <-ch:
			case <-reapWake:
			}
		}
	}
}

// nextReapDeadline is how long until reapForever has something to do besides reaping: the first idle spare's
// retirement, or, for an init never given work, the end of its wait; 0 when there is no such deadline.
func nextReapDeadline() time.Duration {
	var next time.Time
	if !spawned.Load() {
		next = workDeadline()
	}
	spares.Lock()
	if spares.maxIdle > 0 {
		for _, sp := range spares.idle {
			if t := sp.since.Add(spares.maxIdle); next.IsZero() || t.Before(next) {
				next = t
			}
		}
	}
	spares.Unlock()
	if next.IsZero() {
		return 0
	}
	return max(time.Until(next)+time.Millisecond, time.Millisecond)
}

func serveInit(c *net.UnixConn) {
	defer c.Close()
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(8*4))
	for {
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			return
		}
		fds := agent.Rights(oob[:oobn])
		reply := handleInit(buf[:n], fds)
		for _, fd := range fds {
			unix.Close(fd)
		}
		b, _ := json.Marshal(reply)
		if _, err := c.Write(b); err != nil {
			return
		}
	}
}

func handleInit(msg []byte, fds []int) initReply {
	var req initRequest
	if err := json.Unmarshal(msg, &req); err != nil {
		return initReply{Message: "bad request: " + err.Error()}
	}
	switch req.Op {
	case "ping":
		return initReply{OK: true, Pid: os.Getpid()}
	case "spawn":
		if req.Config == nil || len(fds) != 1 {
			return initReply{Message: "spawn needs a config and the root file system's mount fd"}
		}
		cfg, _ := json.Marshal(req.Config)
		if req.Pid != 0 {
			// A fork that chose this spare ahead (and forked an interpreter into its namespaces): it or nothing.
			if err := claimSpareByPid(req.Pid, cfg, fds[0]); err != nil {
				return initReply{Message: err.Error()}
			}
			spawned.Store(true)
			return initReply{OK: true, Pid: req.Pid, Spare: true}
		}
		// Unless the server chooses the spares itself (it places them in cgroups of its own and reserves them
		// for forks): then it asks for a spare by pid, or for a new agent.
		if !req.Fresh {
			if pid, ok := claimSpare(cfg, fds[0]); ok {
				spawned.Store(true)
				return initReply{OK: true, Pid: pid, Spare: true}
			}
		}
		pid, err := startAgent(agent.ConfigFromInit, fds[0], cfg)
		if err != nil {
			return initReply{Message: err.Error()}
		}
		spawned.Store(true)
		return initReply{OK: true, Pid: pid}
	case "hold":
		// A family started ahead of need waits this long for its first sandbox, instead of idleInitLimit.
		heldUntil.Store(time.Now().Add(time.Duration(req.HoldS * float64(time.Second))).UnixNano())
		wakeReaper()
		return initReply{OK: true}
	case "spares":
		spares.Lock()
		spares.maxIdle = time.Duration(req.IdleS * float64(time.Second))
		spares.Unlock()
		wakeReaper()
		if err := keepSpares(req.Count, req.More); err != nil {
			return initReply{Message: err.Error()}
		}
		spares.Lock()
		var pids []int
		for _, sp := range spares.idle {
			pids = append(pids, sp.pid)
		}
		spares.Unlock()
		return initReply{OK: true, Spares: pids}
	}
	return initReply{Message: fmt.Sprintf("unknown op %q", req.Op)}
}

// startAgent starts an agent in fresh mount, network, UTS and IPC namespaces, with fd3 as its descriptor 3 (the
// root mount, or a spare's claim socket) and a channel over which it receives its config (unless it is a spare)
// and hands this init the seccomp listeners of its sandbox's processes. The agent is exec'd from the sealed,
// unreadable ramify binary (see namespaces.sealedBinary), so it is never dumpable, and is registered as one of
// ramify's processes, which sandbox code may not target, before it runs.
func startAgent(arg string, fd3 int, cfg []byte) (int, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socketpair: %w", err)
	}
	defer unix.Close(pair[1])
	if cfg != nil {
		if err := unix.Sendmsg(pair[0], cfg, nil, nil, unix.MSG_NOSIGNAL); err != nil {
			unix.Close(pair[0])
			return 0, fmt.Errorf("send agent config: %w", err)
		}
	}
	ramifyProcs.mu.Lock() // held across the fork, so that the new pid is protected before the agent runs
	pid, err := syscall.ForkExec("/proc/self/exe", []string{"ramify", "__agent", arg}, &syscall.ProcAttr{
		Dir:   "/",
		Env:   []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GOMAXPROCS=1", "GOGC=50"},
		Files: []uintptr{devNull(), 2, 2, uintptr(fd3), uintptr(pair[1])},
		Sys: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
			Setsid:     true,
		},
	})
	if err == nil {
		ramifyProcs.pids[pid] = nil
	}
	ramifyProcs.mu.Unlock()
	if err != nil {
		unix.Close(pair[0])
		return 0, fmt.Errorf("spawn agent: %w", err)
	}
	go superviseFrom(pair[0], pid)
	return pid, nil
}

// ramifyProcs are the family's agents (and spares), by pid in the family's PID namespace, with the namespaces
// each registered. The supervisor refuses every process-targeting call on them and on PID 1; a pid leaves the set
// when the init reaps it, so a recycled pid is never mistaken for an agent.
var ramifyProcs = &procRegistry{pids: map[int][]string{}}

type procRegistry struct {
	mu   sync.Mutex
	pids map[int][]string
}

func (p *procRegistry) Protected(tgid int) bool {
	if tgid == 1 {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.pids[tgid]
	return ok
}

func (p *procRegistry) Namespaces(tgid int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pids[tgid]
}

func (p *procRegistry) Holders(link string) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int
	for pid, links := range p.pids {
		if slices.Contains(links, link) {
			out = append(out, pid)
		}
	}
	return out
}

func (p *procRegistry) setNamespaces(pid int, links []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.pids[pid]; ok {
		p.pids[pid] = links
	}
}

func (p *procRegistry) forget(pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pids, pid)
}

// claimSpare hands cfg and the root mount to an idle spare, if there is a live one, and returns its pid.
func claimSpare(cfg []byte, mountFd int) (int, bool) {
	for {
		spares.Lock()
		if len(spares.idle) == 0 {
			spares.Unlock()
			return 0, false
		}
		sp := spares.idle[0]
		spares.idle = spares.idle[1:]
		spares.Unlock()
		if handOver(sp, cfg, mountFd) == nil {
			return sp.pid, true
		}
		// gone or broken: try the next
	}
}

// handOver sends spare sp (taken off the idle list) its config and root mount, and closes its claim socket; a
// spare that cannot take them is killed.
func handOver(sp spareAgent, cfg []byte, mountFd int) error {
	err := unix.Sendmsg(sp.claim, cfg, unix.UnixRights(mountFd), nil, unix.MSG_NOSIGNAL)
	unix.Close(sp.claim)
	if err != nil {
		syscall.Kill(sp.pid, syscall.SIGKILL)
	}
	return err
}

// claimSpareByPid hands the config and root mount to the idle spare pid.
func claimSpareByPid(pid int, cfg []byte, mountFd int) error {
	sp, ok := takeIdleSpare(pid)
	if !ok {
		return fmt.Errorf("spare agent %d is not idle", pid)
	}
	if err := handOver(sp, cfg, mountFd); err != nil {
		return fmt.Errorf("claim spare agent %d: %w", pid, err)
	}
	return nil
}

// keepSpares starts spares until n are idle, or more beside those idle now if that is more (forgetting spares
// that died); never beyond maxSpares.
func keepSpares(n, more int) error {
	target := -1
	for {
		spares.Lock()
		live := spares.idle[:0]
		for _, sp := range spares.idle {
			if err := unix.Kill(sp.pid, 0); errors.Is(err, unix.ESRCH) {
				unix.Close(sp.claim)
				continue
			}
			live = append(live, sp)
		}
		spares.idle = live
		have := len(spares.idle)
		spares.Unlock()
		if target < 0 {
			target = min(max(n, have+more), maxSpares)
		}
		if have >= target {
			return nil
		}
		claim, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("socketpair: %w", err)
		}
		pid, err := startAgent(agent.SpareArg, claim[1], nil)
		unix.Close(claim[1])
		if err != nil {
			unix.Close(claim[0])
			return err
		}
		spares.Lock()
		spares.idle = append(spares.idle, spareAgent{pid: pid, claim: claim[0], since: time.Now()})
		spares.Unlock()
		wakeReaper() // its retirement is a new deadline
	}
}

// retireIdleSpares lets spares unused for longer than their idle limit go: closing the claim socket ends a spare.
func retireIdleSpares() {
	spares.Lock()
	defer spares.Unlock()
	if spares.maxIdle <= 0 {
		return
	}
	kept := spares.idle[:0]
	for _, sp := range spares.idle {
		if time.Since(sp.since) > spares.maxIdle {
			unix.Close(sp.claim)
			continue
		}
		kept = append(kept, sp)
	}
	spares.idle = kept
}

// dropSpare takes a spare that died (the server retired or could not seat it) off the idle list as it is reaped:
// once reaped its pid may be reused, and a process of a sandbox must never be handed out, or placed, as a spare.
func dropSpare(pid int) {
	if sp, ok := takeIdleSpare(pid); ok {
		unix.Close(sp.claim)
	}
}

// takeIdleSpare takes spare pid off the idle list; false if it is not on it.
func takeIdleSpare(pid int) (spareAgent, bool) {
	spares.Lock()
	defer spares.Unlock()
	i := slices.IndexFunc(spares.idle, func(sp spareAgent) bool { return sp.pid == pid })
	if i < 0 {
		return spareAgent{}, false
	}
	sp := spares.idle[i]
	spares.idle = slices.Delete(spares.idle, i, i+1)
	return sp, true
}

// onlySparesLeft reports whether every child of the init is an idle spare (the family's sandboxes are gone).
func onlySparesLeft() bool {
	spares.Lock()
	idle := map[int]bool{}
	for _, sp := range spares.idle {
		idle[sp.pid] = true
	}
	spares.Unlock()
	for _, pid := range childPids("/proc/self") {
		if !idle[pid] {
			return false
		}
	}
	return true
}

// supervisor judges the process-targeting syscalls of every sandbox of the family (see package seccomp). The
// init serves the listeners because it outlives every member: an interpreter's filter is inherited by its fork
// children in other sandboxes, so its listener must not die with the sandbox that created it.
var supervisor = seccomp.NewSupervisor("/proc", slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))

// superviseFrom receives, from the agent pid until it goes away, its namespaces (registered, and acknowledged)
// and the seccomp listeners of its sandbox's processes, serving each listener. It waits on the runtime's poller
// (the channel as a net.UnixConn), as Serve does: in recvmsg(2), each agent's channel held an OS thread of the
// init's for as long as the agent lived, spares included.
func superviseFrom(fd, pid int) {
	f := os.NewFile(uintptr(fd), "agent channel")
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return
	}
	c, ok := fc.(*net.UnixConn)
	if !ok {
		fc.Close()
		return
	}
	defer c.Close()
	buf := make([]byte, 16<<10)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil || (n == 0 && oobn == 0) {
			return
		}
		if msg := buf[:n]; bytes.HasPrefix(msg, []byte(agent.NamespacesMsg)) {
			var links []string
			if json.Unmarshal(msg[len(agent.NamespacesMsg):], &links) == nil {
				ramifyProcs.setNamespaces(pid, links)
			}
			c.WriteMsgUnix([]byte("ok"), nil, nil) //nolint:errcheck // the agent waits for it
		}
		for _, l := range agent.Rights(oob[:oobn]) {
			go supervisor.Serve(context.Background(), l) //nolint:errcheck // ends when its processes are gone
		}
	}
}

var devNullFD = -1

func devNull() uintptr {
	if devNullFD < 0 {
		devNullFD, _ = unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	}
	return uintptr(devNullFD)
}

// family is the server's view of one family: its init process and the sandboxes in it.
type family struct {
	id        string
	initPid   int
	initStart uint64
	netFD     int // the init's network namespace, where its control socket is
	members   map[string]bool
	cmd       *exec.Cmd        // nil for a family recovered after a restart
	cgroups   cgroups.Manager  // where its init's cgroup (named after the family) is; nil: none to remove
	network   *network.Manager // where its spares' prepared ports are; nil: none to remove
	pool      sparePool        // spare agents placed in cgroups of their own ahead of a claim
	ahead     aheadState       // its share of the spares held ahead of first forks (guarded by Runtime.ahead.mu)
}

// sparePool tracks the family's spare agents that the server has placed in cgroups of their own (named
// <family>.s<pid>), so that a spawn claiming one renames that cgroup to the sandbox's instead of moving the agent
// (see cgroups.Renamer). Where spares are placed the server also chooses which one a spawn claims (reserve): the
// init is asked for that spare by pid, or for a new agent.
type sparePool struct {
	mu      sync.Mutex
	placed  map[int]placedSpare // spare's pid in the family's PID namespace -> where it is
	placing map[int]bool        // being placed now
	claimed map[int]bool        // claimed: never to be placed (until a later list of idle spares lacks it)
	refill  sync.Mutex          // one refill (ask the init for spares, place them) at a time: lists in order

	// life orders placements (read-held while a cgroup is made) and dials of the init (read-held while netFD is
	// used) before the family's end (write-held to set ended and close netFD), so that no spare cgroup is made
	// after the family's cgroups are removed, and no dial uses a closed descriptor's number.
	life  sync.RWMutex
	ended bool
}

// placedSpare is a spare agent in a cgroup of its own, and with a port prepared in its network namespace
// (network.Manager.Prepare) when it could be.
type placedSpare struct {
	nsPid   int // its pid in the family's PID namespace
	cgroup  string
	limits  cgroups.Limits // its cgroup's
	at      time.Time      // when it was placed
	hostPid int
	start   uint64 // the host process's start time (procStart): who hostPid is, should it die and the pid be reused
	port    string // the prepared port's host-side veth; "" if none
}

// reserve takes n placed spares that are alive for a fork, which claims each by its pid, all or none: nil if
// fewer are placed. Spares placed more than maxAge ago (0: no limit) are passed over: the init retires a spare
// at its idle limit, and one it retired between this reserve and the claim would fail the fork. Each spare taken
// is then claimed as far as the pool knows.
func (p *sparePool) reserve(n int, maxAge time.Duration) []placedSpare {
	p.mu.Lock()
	defer p.mu.Unlock()
	var got []placedSpare
	for _, sp := range p.placed {
		if len(got) == n {
			break
		}
		if sp.ready(maxAge) {
			got = append(got, sp)
		}
	}
	if len(got) < n {
		return nil
	}
	if p.claimed == nil {
		p.claimed = map[int]bool{}
	}
	for _, sp := range got {
		delete(p.placed, sp.nsPid)
		p.claimed[sp.nsPid] = true
	}
	return got
}

// ready reports whether the spare is alive and was placed less than maxAge ago (0: no limit).
func (sp placedSpare) ready(maxAge time.Duration) bool {
	return (maxAge <= 0 || time.Since(sp.at) < maxAge) && unix.Kill(sp.hostPid, 0) == nil
}

// usable is how many placed spares reserve(n, maxAge) could take now.
func (p *sparePool) usable(maxAge time.Duration) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, sp := range p.placed {
		if sp.ready(maxAge) {
			n++
		}
	}
	return n
}

// spareCgroupPrefix starts the names of a family's spare cgroups.
func spareCgroupPrefix(familyID string) string { return familyID + ".s" }

// call sends one request (with optional fds) to the family's init.
func (f *family) call(ctx context.Context, req initRequest, fds []int) (initReply, error) {
	// Under the family's life lock: kill closes netFD, and a number closed could name another file by now.
	f.pool.life.RLock()
	if f.pool.ended {
		f.pool.life.RUnlock()
		return initReply{}, errors.New("family init: the family has ended")
	}
	c, err := dialAbstractType(f.netFD, initSocket, unix.SOCK_SEQPACKET)
	f.pool.life.RUnlock()
	if err != nil {
		return initReply{}, fmt.Errorf("dial family init: %w", err)
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		uc.SetDeadline(dl)
	} else {
		uc.SetDeadline(time.Now().Add(30 * time.Second))
	}
	b, _ := json.Marshal(req)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := uc.WriteMsgUnix(b, oob, nil); err != nil {
		return initReply{}, fmt.Errorf("send to family init: %w", err)
	}
	buf := make([]byte, 4096)
	n, err := uc.Read(buf)
	if err != nil {
		return initReply{}, fmt.Errorf("read from family init: %w", err)
	}
	var rep initReply
	if err := json.Unmarshal(buf[:n], &rep); err != nil {
		return initReply{}, err
	}
	if !rep.OK {
		return rep, errors.New(rep.Message)
	}
	return rep, nil
}
