package namespaces

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/cgroups"
	"github.com/ramify-dev/ramify/internal/crashpoint"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/network"
	"github.com/ramify-dev/ramify/internal/runtime"
	"golang.org/x/sys/unix"
)

var _ runtime.Forker = (*Runtime)(nil)

func newToken() string {
	var b [16]byte
	rand.Read(b[:]) //nolint:errcheck // never fails on Linux
	return hex.EncodeToString(b[:])
}

// Fork implements runtime.Forker. The parent is frozen only while its writable layer is cloned into each child's
// (one transaction commit); the children's agents are then started in the parent's family, and the parent's
// interpreter forks once per child: each fork child enters its sandbox's namespaces and cgroup and
// attaches to the child's agent. On any error every child is destroyed and the parent is as it was.
func (r *Runtime) Fork(ctx context.Context, parent runtime.Handle, children []runtime.Spec) (res runtime.ForkResult, err error) {
	start := time.Now()
	r.mu.Lock()
	psb := r.sandboxes[parent.ID]
	f := r.families[parent.FamilyID]
	r.mu.Unlock()
	if psb == nil || f == nil {
		return res, errdefs.New(errdefs.ErrConflict, "sandbox is not running")
	}
	defer r.movesFast()() // each forked interpreter moves into its child's cgroup (and unplaced spares' agents)
	r.forked(f)
	// Children run on their parent's image: the forked interpreters hold its files open.
	children = append([]runtime.Spec(nil), children...)
	for i := range children {
		children[i].Image = psb.h.Image
	}
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	kids := make([]*forkChild, len(children))
	for i, spec := range children {
		kids[i] = &forkChild{spec: spec, token: newToken()}
	}
	// 1. Each child's layer, cloned from the parent's at one instant; meanwhile a spare is seated for each child.
	seated := r.seatSpares(ctx, f, kids)
	pause, err := r.cloneLayers(ctx, psb, parent, kids, &undo)
	<-seated
	undo.add(func() {
		for _, c := range kids {
			if c.sb != nil {
				r.teardown(c.sb)
			}
		}
	})
	res.PauseWindow = pause
	if err != nil {
		return res, err
	}
	r.log.Debug("fork phase", "phase", "layers cloned", "ms", msSince(start))
	pc, err := r.Agent(parent.ID)
	if err != nil {
		return res, err
	}
	// 2. Each child's agent given its root (a seated spare) or spawned, and 3. the parent's interpreter forked
	// once per child, its copies tasks of the parent's until they are moved: room is made for them.
	defer roomForCopies(psb, len(kids))()
	pids, moved, err := r.spawnAndFork(ctx, f, pc, kids, start)
	defer func() { closeFiles(moved) }() // a forked interpreter whose pipe closes unwritten exits
	if err != nil {
		return res, err
	}
	// 4. Each forked interpreter moved into its child's cgroup, and told so.
	if err := r.moveForked(psb, kids, pids, moved, &undo); err != nil {
		return res, err
	}
	r.log.Debug("fork phase", "phase", "interpreter forked and moved", "ms", msSince(start))
	crashpoint.Hit(crashpoint.ForkAfterInterpreters)
	// 5. Each child's start answered: its agent had it wait for its interpreter to attach.
	if err := startForked(kids); err != nil {
		return res, err
	}
	r.log.Debug("fork phase", "phase", "children attached", "ms", msSince(start))
	r.mu.Lock()
	for _, c := range kids {
		f.members[c.spec.ID] = true
		r.sandboxes[c.spec.ID] = c.sb
		res.Children = append(res.Children, c.sb.h)
	}
	r.mu.Unlock()
	res.Total = time.Since(start)
	r.refillSpares(f, len(kids), limitsOf(kids[0].spec), true)
	return res, nil
}

// roomForCopies raises the parent's tasks limit by n, the copies of its interpreter a fork makes, which count as
// its tasks from the fork until each is moved into its child's cgroup; the returned function puts the limit
// back. Without it a parent had to keep n of its max_procs free to fork n children (a max_procs of 16 could not
// fork 32). The parent is held by its fork: nothing else changes its limit meanwhile. Best effort: with the
// limit unchanged, a fork that finds no room fails as it would have (ErrTasksFull).
func roomForCopies(psb *sandbox, n int) (restore func()) {
	limit, err := psb.cg.TasksLimit()
	if err != nil || limit == 0 {
		return func() {}
	}
	if err := psb.cg.SetTasksLimit(limit + int64(n)); err != nil {
		return func() {}
	}
	return func() { psb.cg.SetTasksLimit(limit) } //nolint:errcheck // a limit left higher by n is the lesser harm
}

// forkChild is one child of a fork being made.
type forkChild struct {
	spec  runtime.Spec
	token string // proves to the child's agent that the interpreter attaching is the one forked for it
	dir   string // its layer
	sb    *sandbox
	err   error
	// started has its agent's answer to the child's start, sent as soon as the agent answered (spawnChildren).
	started chan error
	// copyPidfd is a pidfd of its forked interpreter once it is moved (moveForked; nil if it could not be
	// opened), closed by waitStarted.
	copyPidfd *os.File
}

// directCloneMax is the most children whose layers a fork clones from the frozen parent directly. Beyond it the
// parent is frozen for one staging snapshot only, which each child's layer is then cloned from: the clones of
// many children (or of a layer holding much data, under full quotas) would freeze it for hundreds of
// milliseconds (~330 ms for 32 children of a parent with 200 MB of files), where the staging snapshot costs a
// second transaction commit on the fork's path (~6 ms).
const directCloneMax = 8

// cloneLayers clones the parent's layer into each child's at one instant: up to directCloneMax children, with the
// parent frozen around the clones, which run in parallel and so share one btrfs transaction commit; beyond it,
// from a staging snapshot of the frozen parent. It returns how long the parent was frozen. Every layer it cloned
// is removed through undo: at once if a clone fails, later if the fork does.
func (r *Runtime) cloneLayers(ctx context.Context, psb *sandbox, parent runtime.Handle, kids []*forkChild, undo *cleanup) (time.Duration, error) {
	if err := psb.cg.Freeze(ctx); err != nil {
		return 0, fmt.Errorf("freeze parent: %w", err)
	}
	frozen := time.Now()
	var pause time.Duration
	thaw := func() error {
		err := psb.cg.Thaw(context.Background())
		pause = time.Since(frozen)
		return err
	}
	source := parent.Layer()
	staged := len(kids) > directCloneMax
	var berr, terr error
	if staged {
		source = "fork-" + newToken()[:16]
		_, berr = r.cfg.Layers.Clone(ctx, parent.Layer(), source)
		if berr == nil {
			defer func() { // a staging copy only, removed off the fork's path (the reclaim scan finds any left)
				r.bg.Add(1)
				go func() {
					defer r.bg.Done()
					r.cfg.Layers.Remove(context.Background(), source) //nolint:errcheck
				}()
			}()
		}
		terr = thaw()
	}
	errs := make([]error, len(kids))
	if berr == nil {
		var wg sync.WaitGroup
		for i, c := range kids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.dir, errs[i] = r.cfg.Layers.Clone(ctx, source, c.spec.ID)
			}()
		}
		wg.Wait()
	}
	if !staged {
		terr = thaw()
	}
	undo.add(func() {
		for i, c := range kids {
			if errs[i] == nil && berr == nil {
				r.cfg.Layers.Remove(context.Background(), c.spec.ID) //nolint:errcheck
			}
		}
	})
	if berr != nil {
		return pause, fmt.Errorf("snapshot parent layer: %w", berr)
	}
	for i, c := range kids {
		if errs[i] != nil {
			return pause, fmt.Errorf("fork child %s: clone layer: %w", c.spec.ID, errs[i])
		}
	}
	if terr != nil {
		return pause, fmt.Errorf("thaw parent: %w", terr)
	}
	return pause, nil
}

// seatSpares chooses a placed spare for each child (starting those the family lacks: topUpSpares) and seats
// them (seatChildren), in the background: the returned channel is closed when it is done. Children left without
// a seated spare get an agent in spawnChildren.
func (r *Runtime) seatSpares(ctx context.Context, f *family, kids []*forkChild) <-chan struct{} {
	seated := make(chan struct{})
	go func() {
		defer close(seated)
		reserved := f.pool.reserve(len(kids), reserveMaxAge(r.cfg.SpareIdle))
		if reserved == nil {
			reserved = r.topUpSpares(ctx, f, len(kids), limitsOf(kids[0].spec))
		}
		if reserved != nil {
			r.seatChildren(ctx, f, kids, reserved)
		}
	}()
	return seated
}

// spawnAndFork gives each child its agent (spawnChildren) and forks pc's interpreter once per child
// (forkInterpreter): side by side when every child has a seated spare, whose namespaces exist before it is given
// its root; else the interpreter forks once the agents are up. It returns the copies' pids and the write ends of
// their pipes (forkInterpreter), which the caller closes, even on error.
func (r *Runtime) spawnAndFork(ctx context.Context, f *family, pc *agent.Client, kids []*forkChild, start time.Time) (pids []int, moved []*os.File, err error) {
	if slices.ContainsFunc(kids, func(c *forkChild) bool { return c.sb == nil }) {
		if err := r.spawnChildren(ctx, f, kids); err != nil {
			return nil, nil, err
		}
		r.log.Debug("fork phase", "phase", "children spawned", "ms", msSince(start))
		crashpoint.Hit(crashpoint.ForkAfterChildren)
		if pids, moved, err = r.forkInterpreter(ctx, pc, kids, false); err == nil {
			r.log.Debug("fork phase", "phase", "interpreter forked", "ms", msSince(start))
		}
		return pids, moved, err
	}
	var ferr error
	forked := make(chan struct{})
	go func() {
		defer close(forked)
		pids, moved, ferr = r.forkInterpreter(ctx, pc, kids, false)
	}()
	serr := r.spawnChildren(ctx, f, kids)
	<-forked
	if err := errors.Join(serr, ferr); err != nil {
		return pids, moved, err
	}
	r.log.Debug("fork phase", "phase", "children spawned, interpreter forked", "ms", msSince(start))
	crashpoint.Hit(crashpoint.ForkAfterChildren)
	return pids, moved, nil
}

// seatChildren seats spare reserved[i] for kids[i] (seat), in parallel. A child whose spare could not be seated
// (it died: the spare is gone) is left to spawnChildren, which gives it another.
func (r *Runtime) seatChildren(ctx context.Context, f *family, kids []*forkChild, reserved []placedSpare) {
	var wg sync.WaitGroup
	for i, c := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := r.seat(ctx, f, c.spec, reserved[i])
			if err != nil {
				r.log.Debug("seat spare agent", "sandbox", c.spec.ID, "err", err)
				return
			}
			c.sb = sb
		}()
	}
	wg.Wait()
}

// spawnChildren limits each child's layer and gives its agent its root (a seated spare) or spawns it, in
// parallel. Each child's sandbox is set as soon as its agent exists: the fork's undo stops it.
func (r *Runtime) spawnChildren(ctx context.Context, f *family, kids []*forkChild) error {
	var wg sync.WaitGroup
	for _, c := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c.sb != nil {
				c.err = r.giveRoot(ctx, f, c.sb, c.spec, c.dir, c.token)
			} else {
				c.sb, c.err = r.spawn(ctx, f, c.spec, c.dir, c.token)
			}
			if c.err == nil {
				// Held to its quota only once its root is mounted: a child of a parent at its quota refers to
				// as much, and the overlay's mount makes its work directory in the layer (at the quota, the
				// mount would come up read-only). Nothing of the child's runs before its interpreter is moved.
				c.err = r.limitLayer(c.spec.ID, c.spec.DiskMiB)
			}
			if c.err == nil {
				// Its agent answers: the start (which waits there for the forked interpreter to attach) goes now,
				// so that the agent is ready the moment it attaches (startForked collects the answers).
				c.started = make(chan error, 1)
				go func() { c.started <- c.sb.client.Start(ctx, startRequest(c.spec)) }()
			}
		}()
	}
	wg.Wait()
	for _, c := range kids {
		if c.err != nil {
			return fmt.Errorf("fork child %s: %w", c.spec.ID, c.err)
		}
	}
	return nil
}

// forkInterpreter forks the interpreter of the parent's agent pc, one copy per child. Each copy gets its child's
// namespaces and the read end of a pipe on which it waits, until the server has moved it into its child's cgroup
// (moveForked), before it enters them. It returns the copies' pids (family PID namespace) and the pipes' write
// ends, which the caller closes (a copy whose pipe closes unwritten exits). With handover (a zygote's, one child)
// the interpreter does the same itself, unforked (agent.Client.HandOverInterpreter), and the pid is its own.
func (r *Runtime) forkInterpreter(ctx context.Context, pc *agent.Client, kids []*forkChild, handover bool) ([]int, []*os.File, error) {
	targets := make([]agent.ForkTarget, len(kids))
	var passed []*os.File // taken (sent and closed) by ForkInterpreter
	moved := make([]*os.File, len(kids))
	for i, c := range kids {
		nsPid, hostPid := c.sb.h.AgentNsPid, c.sb.h.AgentPid
		targets[i] = agent.ForkTarget{AgentPid: nsPid, Gid: agent.SandboxGID(nsPid), Token: c.token, Cwd: c.spec.Cwd, Cgroup: cgroupMarker(c.spec.ID), NS: len(passed)}
		fs, err := namespaceFiles(hostPid)
		if err == nil {
			var pr *os.File
			pr, moved[i], err = os.Pipe()
			fs = append(fs, pr)
		}
		passed = append(passed, fs...)
		if err != nil {
			closeFiles(passed)
			return nil, moved, fmt.Errorf("fork child %s: %w", c.spec.ID, err)
		}
	}
	// A healthy interpreter forks in milliseconds; one kept from answering (code in the sandbox holding the GIL
	// in C code) would hold the fork, and its parent, for ever. Its agent replaces it if it stays silent.
	stall := cmp.Or(r.cfg.InterpreterStall, runtime.DefaultInterpreterStall)
	ictx, cancel := context.WithTimeoutCause(ctx, stall, errInterpreterStalled)
	defer cancel()
	var pids []int
	var err error
	if handover {
		pids, err = pc.HandOverInterpreter(ictx, targets[0], passed)
	} else {
		pids, err = pc.ForkInterpreter(ictx, targets, passed)
	}
	if err != nil {
		if errors.Is(context.Cause(ictx), errInterpreterStalled) {
			// Every later call would wait behind the fork for ever: the agent replaces the interpreter if it is
			// still silent (its state is lost; the next run_code says so).
			if replaced, err := pc.ReplaceStuck(ctx, runtime.StuckGrace); err != nil || replaced {
				r.log.Warn("interpreter silent during a fork", "replaced", replaced, "err", err)
			}
			return nil, moved, errdefs.New(errdefs.ErrConflict, fmt.Sprintf("the interpreter did not answer the fork "+
				"within %v: code in the sandbox keeps it from answering (a thread holding the GIL in C code?); nothing "+
				"was forked, and the interpreter is replaced (its state lost) if it stays silent", stall))
		}
		return nil, moved, fmt.Errorf("fork interpreter: %w", err)
	}
	return pids, moved, nil
}

// errInterpreterStalled ends a fork's wait for an interpreter that does not answer (forkInterpreter).
var errInterpreterStalled = errors.New("the interpreter did not answer the fork")

// moveForked moves each forked interpreter, which starts in the parent's cgroup, into its child's, then writes
// its pipe; a failure kills the copies moved so far (through undo). Each pipe written is closed and cleared.
func (r *Runtime) moveForked(psb *sandbox, kids []*forkChild, pids []int, moved []*os.File, undo *cleanup) error {
	procs, err := psb.cg.Procs()
	if err != nil {
		return fmt.Errorf("parent cgroup: %w", err)
	}
	byNsPid := make(map[int]int, len(procs)) // one /proc read per process, not one per process and copy
	for _, p := range procs {
		byNsPid[nsPidOf(p)] = p
	}
	for i, c := range kids {
		hostPid := byNsPid[pids[i]]
		if hostPid == 0 {
			return fmt.Errorf("find forked interpreter: namespace pid %d not found", pids[i])
		}
		undo.add(func() { syscall.Kill(hostPid, syscall.SIGKILL) })
		if fd, err := unix.PidfdOpen(hostPid, 0); err == nil {
			c.copyPidfd = os.NewFile(uintptr(fd), "pidfd") // watched by startForked; the copy is in the parent's cgroup: this pid's
		}
		if err := c.sb.cg.Add(hostPid); err != nil {
			return fmt.Errorf("move forked interpreter to %s: %w", c.spec.ID, err)
		}
		_, err = moved[i].Write([]byte{1})
		moved[i].Close()
		moved[i] = nil
		if err != nil {
			return fmt.Errorf("tell forked interpreter of %s it was moved: %w", c.spec.ID, err)
		}
	}
	return nil
}

// startForked collects each child's start (sent by spawnChildren): its agent's answer once the child's
// interpreter has attached. A forked interpreter that exits before it attaches (it could not make what its
// parent held its own, say) fails the fork at once, where its agent would wait for it until its start's
// timeout.
func startForked(kids []*forkChild) error {
	errs := make([]error, len(kids))
	for i, c := range kids {
		errs[i] = c.waitStarted()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("start fork children: %w", err)
	}
	return nil
}

// waitStarted waits for c's start, watching its forked interpreter (copyPidfd) meanwhile, which it closes.
func (c *forkChild) waitStarted() error {
	if c.copyPidfd == nil {
		return <-c.started
	}
	defer c.copyPidfd.Close()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-c.started:
			return err
		case <-tick.C:
			fds := []unix.PollFd{{Fd: int32(c.copyPidfd.Fd()), Events: unix.POLLIN}}
			if n, _ := unix.Poll(fds, 0); n > 0 {
				select {
				case err := <-c.started: // it attached, then exited: the start says what happened
					return err
				default:
				}
				return fmt.Errorf("fork child %s: %w", c.spec.ID, errdefs.New(errdefs.ErrConflict, "the child's "+
					"interpreter, forked from the parent's, exited before it attached: it could not make its own "+
					"what the parent holds (a shared memory mapping too large to copy, say)"))
			}
		}
	}
}

// msSince is the time since t in milliseconds, to the microsecond (for phase logs).
func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// spareRefillDelay is how long after a fork its family starts spares for the next one.
const spareRefillDelay = 250 * time.Millisecond

// refillSpares has the family's init start spares, in the background, for a next fork like this one: a family
// that forked n children once is likely to do so again (search rounds, fork and merge loops); or for a first
// fork (PrepareFork). ports: whether each gets its port prepared too (placeSpare).
func (r *Runtime) refillSpares(f *family, n int, limits cgroups.Limits, ports bool) {
	n = min(n, r.cfg.SpareAgents)
	if n <= 0 {
		return
	}
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		// Not at once: the children's first calls come right after a fork, and starting n agents (~25 ms of CPU
		// each) beside them would slow them down on a small machine.
		time.Sleep(spareRefillDelay)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// One refill at a time: placeSpares must see the init's lists of idle spares in the order they were
		// made, or an older list could have it place a spare a fork has claimed since.
		f.pool.refill.Lock()
		defer f.pool.refill.Unlock()
		if !r.wantsSpares(f) {
			return // spares ahead of a first fork, given up since (PrepareFork)
		}
		rep, err := f.call(ctx, initRequest{Op: "spares", Count: n, IdleS: r.cfg.SpareIdle.Seconds()}, nil)
		if err != nil {
			r.log.Debug("start spare agents", "family", f.id, "err", err)
			return
		}
		r.placeSpares(f, rep.Spares, limits, ports)
	}()
}

// topUpSpares has the family's init start the spares that a fork of n children lacks, places them with the
// children's limits and reserves n; nil if it could not (or spares are not placed here, or are turned off).
// Started as the fork begins, the new agents come up while the parent's layer is cloned, and the parent's
// interpreter forks into their namespaces while they are handed their roots: a family's first fork no longer
// starts an agent per child after the clones, then forks the interpreter.
func (r *Runtime) topUpSpares(ctx context.Context, f *family, n int, limits cgroups.Limits) []placedSpare {
	if _, ok := r.cfg.Cgroups.(cgroups.Renamer); !ok || r.cfg.SpareAgents <= 0 || n > maxSpares {
		return nil
	}
	f.pool.refill.Lock() // the init's lists of idle spares placed in order (refillSpares)
	defer f.pool.refill.Unlock()
	maxAge := reserveMaxAge(r.cfg.SpareIdle)
	if more := n - f.pool.usable(maxAge); more > 0 {
		rep, err := f.call(ctx, initRequest{Op: "spares", More: more, IdleS: r.cfg.SpareIdle.Seconds()}, nil)
		if err != nil {
			r.log.Debug("start spare agents for a fork", "family", f.id, "err", err)
			return nil
		}
		r.placeSpares(f, rep.Spares, limits, true)
	}
	return f.pool.reserve(n, maxAge)
}

// placeSpares puts each idle spare (pids in the family's PID namespace) in a cgroup of its own, off the fork's
// path, so that the spawn claiming it renames the cgroup instead of moving the agent (a v1 move waits ~8 ms for
// RCU), and, if ports, with its port prepared (placeSpare). Cgroups of spares no longer idle and never claimed
// (retired) are removed. Only where cgroups rename (v1).
func (r *Runtime) placeSpares(f *family, idle []int, limits cgroups.Limits, ports bool) {
	if _, ok := r.cfg.Cgroups.(cgroups.Renamer); !ok {
		return
	}
	p := &f.pool
	p.mu.Lock()
	if p.placed == nil {
		p.placed, p.placing = map[int]placedSpare{}, map[int]bool{}
	}
	isIdle := map[int]bool{}
	for _, pid := range idle {
		isIdle[pid] = true
	}
	for pid, sp := range p.placed {
		if !isIdle[pid] {
			if cg, err := r.cfg.Cgroups.Load(sp.cgroup); err == nil && cg.Delete() == nil {
				delete(p.placed, pid)
			}
		}
	}
	for pid := range p.claimed {
		if !isIdle[pid] {
			delete(p.claimed, pid) // it is a sandbox's agent now; the pid may come back as a new spare
		}
	}
	var todo []int
	for _, nsPid := range idle {
		if p.placed[nsPid].cgroup == "" && !p.claimed[nsPid] && !p.placing[nsPid] {
			p.placing[nsPid] = true
			todo = append(todo, nsPid)
		}
	}
	p.mu.Unlock()
	// In parallel: concurrent moves share the kernel's grace period.
	hostPids := hostPidsOf(f.initPid, todo)
	var wg sync.WaitGroup
	for _, nsPid := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sp := r.placeSpare(f, nsPid, hostPids[nsPid], limits, ports)
			p.mu.Lock()
			if sp.cgroup != "" {
				p.placed[nsPid] = sp
			}
			delete(p.placing, nsPid)
			p.mu.Unlock()
		}()
	}
	wg.Wait()
}

// placeSpare moves spare nsPid (host pid hostPid; 0: not found) into a new cgroup of its own, with limits (those
// the family's last fork gave its children, which its next fork likely gives too: the claim then writes none),
// and, if ports, prepares its port (preparePort); it returns where it is (zero if it could not, or the family
// has ended).
func (r *Runtime) placeSpare(f *family, nsPid, hostPid int, limits cgroups.Limits, ports bool) placedSpare {
	f.pool.life.RLock()
	defer f.pool.life.RUnlock()
	if f.pool.ended || hostPid == 0 {
		return placedSpare{}
	}
	name := fmt.Sprintf("%s%d", spareCgroupPrefix(f.id), nsPid)
	cg, err := r.cfg.Cgroups.Create(name, limits)
	if err != nil {
		r.log.Debug("place spare agent", "family", f.id, "spare", nsPid, "err", err)
		return placedSpare{}
	}
	start, err := procStart(hostPid)
	if err == nil {
		err = cg.Add(hostPid)
	}
	if err != nil {
		cg.Delete() //nolint:errcheck // empty: the move failed
		return placedSpare{}
	}
	sp := placedSpare{nsPid: nsPid, cgroup: name, limits: limits, at: time.Now(), hostPid: hostPid, start: start}
	if ports {
		sp.port = r.preparePort(f, nsPid, hostPid)
	}
	return sp
}

// reserveMaxAge is how long after its placement a spare may still be chosen ahead by a fork (sparePool.reserve),
// given the spares' idle limit (0: none): a margin short of it.
func reserveMaxAge(idle time.Duration) time.Duration {
	if idle <= 0 {
		return 0
	}
	return idle - min(idle/2, 10*time.Second)
}

// preparePort makes the veth pair of spare nsPid (host pid hostPid) ahead of its claim, which then only names,
// addresses and raises it (network.Manager.AttachPrepared): creating a veth and putting it on the bridge hold the
// kernel's RTNL lock, which serialized the children of a fork. It returns the port's host-side name, "" if it
// could not be made (the claim then attaches a new one).
func (r *Runtime) preparePort(f *family, nsPid, hostPid int) string {
	if r.cfg.Network == nil {
		return ""
	}
	fd, err := openNetNS(hostPid)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	name := network.SparePortName(fmt.Sprintf("%s/%d", f.id, nsPid))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.cfg.Network.Prepare(ctx, fd, name); err != nil {
		r.log.Debug("prepare spare port", "family", f.id, "spare", nsPid, "err", err)
		return ""
	}
	return name
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// namespaceFiles opens the IPC, UTS, network and mount namespaces of the agent with host pid pid, in the order
// a forked interpreter joins them (agent.ForkTarget.NS).
func namespaceFiles(pid int) ([]*os.File, error) {
	var out []*os.File
	for _, ns := range []string{"ipc", "uts", "net", "mnt"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, fmt.Errorf("open the agent's %s namespace: %w", ns, err)
		}
		out = append(out, f)
	}
	return out, nil
}

// cgroupMarker is how a forked interpreter names its child's cgroup when it reports that the move it was told of
// did not happen.
func cgroupMarker(id string) string { return "/" + id }

// Swap implements runtime.Forker (merge_into): the parent's old processes, cgroup, network and layer are
// destroyed, and the winner's running sandbox is re-keyed under the parent's id, keeping its resources (named
// after the winner, as the returned handle records).
func (r *Runtime) Swap(ctx context.Context, parent, winner runtime.Handle) (runtime.Handle, error) {
	r.mu.Lock()
	psb, wsb := r.sandboxes[parent.ID], r.sandboxes[winner.ID]
	if psb == nil || wsb == nil {
		r.mu.Unlock()
		return runtime.Handle{}, errdefs.New(errdefs.ErrConflict, "sandbox is not running")
	}
	// Re-key first, under the lock: from here on, calls for parent.ID reach the winner's agent.
	nh := r.Rekeyed(parent, wsb.h)
	wsb.h = nh
	r.sandboxes[parent.ID] = wsb
	delete(r.sandboxes, winner.ID)
	if wf := r.families[winner.FamilyID]; wf != nil {
		delete(wf.members, winner.ID)
		wf.members[parent.ID] = true
	}
	var dead *family
	if pf := r.families[parent.FamilyID]; pf != nil && parent.FamilyID != winner.FamilyID {
		delete(pf.members, parent.ID)
		if len(pf.members) == 0 {
			delete(r.families, parent.FamilyID)
			dead = pf
		}
	}
	r.mu.Unlock()

	// Then destroy the parent's old state: its processes die now; the slower clean-up (waiting for the cgroup
	// to empty, removing it, the veth and the layer) finishes in the background.
	if pids, err := psb.cg.Procs(); err == nil {
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	retired := r.retire(parent.Layer()) // the old state's resources are named after the id it was created with
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		defer retired()
		r.teardown(psb)
		if dead != nil {
			dead.kill()
		}
		if err := r.cfg.Layers.Remove(context.Background(), parent.Layer()); err != nil {
			r.log.Warn("merge: remove the parent's old layer", "sandbox", parent.ID, "err", err)
		}
	}()
	return nh, nil
}

// Rekeyed implements runtime.Forker: the winner's handle under the parent's id, its resources keeping the
// names they were created with.
func (r *Runtime) Rekeyed(parent, winner runtime.Handle) runtime.Handle {
	nh := winner
	nh.ID = parent.ID
	nh.LayerID = winner.Layer()
	nh.Cgroup = winner.CgroupName()
	nh.Veth = vethOf(winner)
	return nh
}

// UpperDir implements runtime.Forker.
func (r *Runtime) UpperDir(h runtime.Handle) string {
	return filepath.Join(r.cfg.Layers.Path(h.Layer()), "upper")
}

// LowerDirs implements runtime.Forker.
func (r *Runtime) LowerDirs(h runtime.Handle) ([]string, error) { return r.lowers(h.Image) }

// Freeze implements runtime.Forker.
func (r *Runtime) Freeze(ctx context.Context, h runtime.Handle) error {
	sb, err := r.running(h.ID)
	if err != nil {
		return err
	}
	return sb.cg.Freeze(ctx)
}

// Thaw implements runtime.Forker.
func (r *Runtime) Thaw(ctx context.Context, h runtime.Handle) error {
	sb, err := r.running(h.ID)
	if err != nil {
		return err
	}
	return sb.cg.Thaw(ctx)
}
