package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ramify-dev/ramify/internal/runtime"
)

// Children made ahead. A fork's work (cloning the parent's layer, seating its children, forking its interpreter
// into them, every child attaching) takes ~50-70 ms for five children on a 2-core host, nearly all of it CPU. A
// sandbox that forked is likely to fork again like that (tree search, best-of-n, retries), and between its calls
// it sits idle while the agent driving it thinks. So once a sandbox that forked has been idle for aheadIdle, the
// service forks it, in the background, into as many hidden children as its last fork had (pooled, status warm:
// invisible to the API, not counted against capacity, like the warm pool's), and notes the runtime's stillness
// mark of the parent (runtime.Stiller).
//
// The next fork call on it with at most that many children and no overrides adopts them: if the parent's mark
// is unchanged (no process in it but its agent ran since they were made, and it has the same processes), its
// interpreter and files are as they were when the children were forked from them, so they start from the
// parent's state at the call, as a fork's children must. Adopting is saving their records: a few milliseconds.
// Every call through the service that could change the parent (run_code, exec, files, merge, pause, keys, a
// restart of its agent, delete) drops them first (a keepalive does not: the children take the parent's spec as
// it is at the fork); a mark that moved drops them at the call. Unused extra children are dropped too.
//
// A fork runs the interpreter's at-fork handlers; a session whose handlers could show a fork nobody asked for
// (agent.Client.ForkHooks) gets none.
//
// Their cost is bounded: at most Config.ForkAhead children made ahead at once across the server (0 turns the
// feature off), forks of at most that many children only, dropped after aheadKeep unused, and a sandbox whose
// children made ahead were dropped unused aheadTries times in a row gets none until it forks again.

const (
	// aheadIdle is how long a sandbox that forked sits idle before children are made ahead for its next fork.
	aheadIdle = 250 * time.Millisecond
	// aheadKeep is how long children made ahead wait for a fork before they are dropped.
	aheadKeep = 2 * time.Minute
	// aheadTries is how many sets of children made ahead a sandbox may leave unused in a row.
	aheadTries = 2
	// aheadSettle separates the two marks taken once children are made: the parent must be still across it.
	aheadSettle = 5 * time.Millisecond
	// aheadTimeout bounds the making of a set (it holds the parent: its calls, a delete, the health watcher
	// wait): a family's init stopped from the host would otherwise hold it for as long.
	aheadTimeout = 20 * time.Second
)

// ahead is a sandbox's children made ahead.
type ahead struct {
	kids   []*entry
	mark   string
	pause  time.Duration // how long the parent was frozen when they were forked
	expire *time.Timer
}

// noteFork records that e forked n children with its own spec: the shape its next children made ahead take.
func (s *Service) noteFork(e *entry, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n <= s.cfg.ForkAhead {
		e.aheadN, e.aheadTries = n, aheadTries
	}
}

// dropAheads drops the children made ahead of es (held by the caller, exclusively or shared) before op runs, and
// stops any timer that would make new ones. The caller holds none of s.mu. Before a delete they are destroyed
// before it returns: a family whose last listed sandbox is deleted goes with it, as it did before them.
func (s *Service) dropAheads(es []*entry, op Op) {
	s.mu.Lock()
	var doomed []*ahead
	for _, e := range es {
		if e.aheadTimer != nil {
			e.aheadTimer.Stop()
			e.aheadTimer = nil
		}
		if a := s.takeAheadLocked(e.rec.ID); a != nil {
			doomed = append(doomed, a)
		}
	}
	s.mu.Unlock()
	for _, a := range doomed {
		s.log.Debug("children made ahead dropped", "sandbox", a.kids[0].rec.ParentID, "n", len(a.kids), "why", string(op))
		s.dropKids(a.kids, op == OpDestroy)
	}
}

// takeAheadLocked removes id's children made ahead from the books and returns them (nil if none). The caller
// holds s.mu.
func (s *Service) takeAheadLocked(id string) *ahead {
	a := s.aheads[id]
	if a == nil {
		return nil
	}
	delete(s.aheads, id)
	a.expire.Stop()
	return a
}

// aheadKidsLocked counts the children made ahead that are ready. The caller holds s.mu.
func (s *Service) aheadKidsLocked() int {
	n := 0
	for _, a := range s.aheads {
		n += len(a.kids)
	}
	return n
}

// dropKids counts children made ahead dropped and destroys them in the background (or before it returns, with
// wait or when the service is closing).
func (s *Service) dropKids(kids []*entry, wait bool) {
	if len(kids) == 0 {
		return
	}
	s.mu.Lock()
	s.aheadCount.dropped += int64(len(kids))
	s.mu.Unlock()
	destroy := func() {
		for _, k := range kids {
			if err := s.cfg.Runtime.Destroy(context.Background(), k.handle); err != nil {
				s.log.Warn("drop a child made ahead", "sandbox", k.rec.ID, "err", err)
			}
		}
		s.mu.Lock()
		for _, k := range kids {
			s.retire(k)
		}
		s.mu.Unlock()
	}
	if wait || !s.goBackground(destroy) {
		destroy()
	}
}

// planAheads arms, for each of es that forked and may have children made ahead, the timer that makes them once
// it has been idle for aheadIdle (a call on it meanwhile drops the timer, and its end arms it again).
func (s *Service) planAheads(es []*entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range es {
		if e.aheadN == 0 || e.aheadTries <= 0 || e.gone || s.closing || s.aheads[e.rec.ID] != nil {
			continue
		}
		if e.aheadTimer != nil {
			e.aheadTimer.Stop()
		}
		e.aheadTimer = time.AfterFunc(aheadIdle, func() { s.makeAhead(e) })
	}
}

// makeAhead forks e into children made ahead, if it is idle (no call holds it) and still may have them.
func (s *Service) makeAhead(e *entry) {
	st, ok := s.cfg.Runtime.(runtime.Stiller)
	if !ok {
		return
	}
	fk, err := s.forker()
	if err != nil {
		return
	}
	if !e.op.TryLock() {
		return // a call holds it: its end plans again
	}
	defer e.op.Unlock()
	s.mu.Lock()
	n, id := e.aheadN, e.rec.ID
	if s.closing || e.gone || Status(e.rec.Status) != StatusRunning || n == 0 || e.aheadTries <= 0 ||
		s.aheads[id] != nil || s.aheadKidsLocked()+s.aheadPending+n > s.cfg.ForkAhead || !s.enterLocked() {
		s.mu.Unlock()
		return
	}
	defer s.wg.Done()
	e.aheadTimer = nil
	s.aheadPending += n // other sandboxes' sets made meanwhile count it
	spec, parent := e.spec, e.handle
	s.mu.Unlock()
	made := false
	defer func() {
		if !made {
			s.mu.Lock()
			s.aheadPending -= n
			s.mu.Unlock()
		}
	}()
	// A delete of the parent stops the making, as it stops a pause.
	actx, done := s.stoppable(s.ctx, e)
	defer done()
	ctx, cancel := context.WithTimeout(actx, aheadTimeout)
	defer cancel()
	if before, err := st.Stillness(ctx, parent); err != nil || before.Busy {
		s.log.Debug("no children made ahead", "sandbox", id, "busy", before.Busy, "err", err)
		return
	}
	if s.forkHooks(ctx, id) {
		// Its fork would run handlers that someone may see before any fork was asked for: none until its next
		// fork, which checks again.
		s.mu.Lock()
		e.aheadN = 0
		s.mu.Unlock()
		s.log.Debug("no children made ahead: its session registered at-fork handlers", "sandbox", id)
		return
	}
	s.mu.Lock()
	e.aheadTries-- // a set made: one fewer may go unused
	s.mu.Unlock()
	start := time.Now()
	var undo undoStack
	kids, res, err := s.forkChildren(ctx, fk, e, spec, n, StatusWarm, &undo)
	var mark string
	if err == nil {
		mark, err = s.settled(ctx, st, parent)
	}
	if err == nil {
		err = s.warmKids(ctx, kids)
	}
	if err != nil {
		s.log.Debug("children made ahead failed", "sandbox", id, "err", s.fail(ctx, &undo, err))
		return
	}
	a := &ahead{kids: kids, mark: mark, pause: res.PauseWindow}
	made = true
	s.mu.Lock()
	s.aheads[id] = a
	s.aheadPending -= n // counted as ready from now on
	s.aheadCount.made += int64(n)
	a.expire = time.AfterFunc(aheadKeep, func() { s.expireAhead(id, a) })
	s.mu.Unlock()
	s.log.Debug("children made ahead", "sandbox", id, "n", n, "ms", time.Since(start).Milliseconds())
}

// forkHooks reports whether id's interpreter has at-fork handlers that a fork made ahead of its call must not
// run (agent.Client.ForkHooks); an interpreter that cannot say is taken to have them.
func (s *Service) forkHooks(ctx context.Context, id string) bool {
	c, err := s.cfg.Runtime.Agent(id)
	if err != nil {
		return true
	}
	hooks, err := c.ForkHooks(ctx)
	return hooks || err != nil
}

// warmKids has each child made ahead run a cell that leaves no trace (agent.Client.Warm), side by side: their first
// run after the fork then costs what a second one does.
func (s *Service) warmKids(ctx context.Context, kids []*entry) error {
	errs := make([]error, len(kids))
	var wg sync.WaitGroup
	for i, k := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := s.cfg.Runtime.Agent(k.handle.ID)
			if err == nil {
				err = c.Warm(ctx)
			}
			if err != nil {
				errs[i] = fmt.Errorf("warm %s: %w", k.rec.ID, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// settled waits until the parent's mark stays the same across aheadSettle (its interpreter, which has just
// forked, is back waiting for calls) and returns that mark.
func (s *Service) settled(ctx context.Context, st runtime.Stiller, parent runtime.Handle) (string, error) {
	prev := ""
	for range 5 {
		m, err := st.Stillness(ctx, parent)
		if err != nil {
			return "", err
		}
		if m.Busy {
			return "", fmt.Errorf("sandbox runs more than its interpreter")
		}
		if m.Mark == prev {
			return m.Mark, nil
		}
		prev = m.Mark
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(aheadSettle):
		}
	}
	return "", fmt.Errorf("sandbox did not settle")
}

// expireAhead drops a, id's children made ahead, unless they were taken meanwhile.
func (s *Service) expireAhead(id string, a *ahead) {
	s.mu.Lock()
	if s.aheads[id] != a {
		s.mu.Unlock()
		return
	}
	s.takeAheadLocked(id)
	s.mu.Unlock()
	s.log.Debug("children made ahead dropped", "sandbox", id, "n", len(a.kids), "why", "unused for "+aheadKeep.String())
	s.dropKids(a.kids, false)
}

// forkFromAhead forks e (held exclusively, running) into n children with spec (its own) from children made
// ahead, if it has enough and its mark has not moved since. ok is false when it could not: the caller forks as
// usual (children that could not be used are dropped). With ok, err is the fork's outcome.
func (s *Service) forkFromAhead(ctx context.Context, e *entry, spec CreateRequest, n int) (out ForkResult, ok bool, err error) {
	st, isStiller := s.cfg.Runtime.(runtime.Stiller)
	s.mu.Lock()
	id, parent := e.rec.ID, e.handle
	a := s.takeAheadLocked(id)
	if a == nil || !isStiller {
		s.mu.Unlock()
		return out, false, nil
	}
	if len(a.kids) < n {
		s.mu.Unlock()
		s.dropKids(a.kids, false)
		return out, false, nil
	}
	if err := s.admitLocked(spec, n); err != nil {
		s.mu.Unlock()
		s.dropKids(a.kids, false)
		return out, true, fmt.Errorf("fork %s: %w", id, err)
	}
	s.mu.Unlock()
	start := time.Now()
	now, err := st.Stillness(ctx, parent)
	if err != nil || now.Mark != a.mark {
		s.log.Debug("children made ahead dropped", "sandbox", id, "n", len(a.kids), "why", "the sandbox changed", "err", err)
		s.dropKids(a.kids, false)
		return out, false, nil
	}
	kids, extra := a.kids[:n], a.kids[n:]
	s.dropKids(extra, false)
	// Each child must still run as it was made: one whose interpreter or agent was killed since (from the host)
	// would answer InterpreterDied or nothing, and the health watcher sees that only at its next look.
	for _, k := range kids {
		s.mu.Lock()
		h := k.handle
		s.mu.Unlock()
		if err := st.Intact(h); err != nil {
			s.log.Warn("children made ahead dropped: one of them was lost", "sandbox", id, "child", h.ID, "err", err)
			s.dropKids(kids, false)
			return out, false, nil
		}
	}
	// The parent's spec as it is now: a keepalive since may have changed its timeout, which children inherit
	// (whatever the runtime was given, limits, env, cwd, network, only calls that drop them change).
	specJSON, _ := json.Marshal(spec)
	s.mu.Lock()
	for _, k := range kids {
		k.spec, k.rec.Spec = spec, specJSON
	}
	s.mu.Unlock()
	if err := s.startChildren(ctx, kids, time.Now().UTC()); err != nil {
		s.dropKids(kids, false)
		return out, true, fmt.Errorf("fork %s: %w", id, err)
	}
	s.noteFork(e, n)
	s.mu.Lock()
	s.aheadCount.used += int64(n)
	s.mu.Unlock()
	return s.forked(e, kids, a.pause, true, start), true, nil
}

// dropLostAhead drops the children made ahead that id, whose machinery died, is one of, so that no fork takes a
// child that cannot answer. It reports whether id is a child made ahead (or being made).
func (s *Service) dropLostAhead(id string) bool {
	s.mu.Lock()
	e := s.items[id]
	if e == nil || !e.pooled || e.rec.ParentID == "" {
		s.mu.Unlock()
		return false
	}
	parent := e.rec.ParentID
	var a *ahead
	if cur := s.aheads[parent]; cur != nil && slices.Contains(cur.kids, e) {
		a = s.takeAheadLocked(parent)
	}
	s.mu.Unlock()
	if a != nil {
		s.log.Warn("children made ahead dropped: one of them was lost", "sandbox", parent, "child", id)
		s.dropKids(a.kids, false)
	}
	return true
}
