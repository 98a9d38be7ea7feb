package namespaces

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/ramify-dev/ramify/internal/cgroups"
	"github.com/ramify-dev/ramify/internal/runtime"
)

// Spares ahead of a family's first fork. After a fork a family keeps spares for its next one (refillSpares), but
// its first fork has none and starts an agent per child (~15 ms of CPU each: on two cores a first fork of 5 took
// twice as long as the next). A sandbox whose interpreter runs code is the kind that forks, so PrepareFork gives
// its family aheadPerFamily spares, within a server-wide budget (Config.SpareAhead spares). When the budget is
// spent, the family granted spares longest ago gives them up to the new one, if it has held them at least
// aheadMinHold: a burst of new sandboxes does not churn agents (at most budget/aheadPerFamily grants per hold).
// A family that forks leaves the budget: its spares are then its own (refillSpares, retired when idle).

const (
	aheadPerFamily = 5
	aheadMinHold   = 5 * time.Second
)

// aheadBudget is the families holding spares ahead of their first fork, oldest grant first.
type aheadBudget struct {
	mu      sync.Mutex
	granted []*family
}

// aheadState is where a family stands with the budget (guarded by aheadBudget.mu).
type aheadState struct {
	granted bool      // holds a share of the budget
	at      time.Time // when it was granted
	forked  bool      // has forked: never in the budget again
}

var _ runtime.ForkPreparer = (*Runtime)(nil)

// PrepareFork implements runtime.ForkPreparer: it starts spares in h's family, with the cgroup limits of limits
// (a fork's children have their parent's unless told otherwise), unless the family has forked or holds spares
// ahead already (granted less than --spare-agents-idle ago), or the budget is held by families granted less than
// aheadMinHold ago.
func (r *Runtime) PrepareFork(h runtime.Handle, limits runtime.Spec) {
	k := min(aheadPerFamily, r.cfg.SpareAhead, r.cfg.SpareAgents)
	if _, ok := r.cfg.Cgroups.(cgroups.Renamer); !ok || k <= 0 {
		return // spares are placed (and chosen by the server) only where cgroups rename
	}
	r.mu.Lock()
	f := r.families[h.FamilyID]
	r.mu.Unlock()
	if f == nil {
		return
	}
	a := &r.ahead
	a.mu.Lock()
	// A grant lasts as long as the spares it started (the init retires them --spare-agents-idle after their
	// start): one older than that is made again.
	lapsed := r.cfg.SpareIdle > 0 && time.Since(f.ahead.at) >= r.cfg.SpareIdle
	if f.ahead.forked || (f.ahead.granted && !lapsed) {
		a.mu.Unlock()
		return
	}
	a.granted = slices.DeleteFunc(a.granted, func(g *family) bool { return g == f || g.hasEnded() })
	held := make([]time.Time, len(a.granted))
	for i, g := range a.granted {
		held[i] = g.ahead.at
	}
	now := time.Now()
	n, ok := admitAhead(held, k, r.cfg.SpareAhead, now)
	if !ok {
		a.mu.Unlock() // no holder is due to give its spares up: no grant now (a later call asks again)
		return
	}
	evicted := slices.Clone(a.granted[:n])
	a.granted = a.granted[n:]
	for _, old := range evicted {
		old.ahead.granted = false
	}
	f.ahead = aheadState{granted: true, at: now}
	a.granted = append(a.granted, f)
	a.mu.Unlock()
	for _, old := range evicted {
		r.bg.Add(1)
		go func() {
			defer r.bg.Done()
			r.retireSpares(old)
		}()
	}
	r.log.Debug("spares ahead of a first fork", "family", f.id, "spares", k, "gave_up", len(evicted))
	// No ports prepared: a veth appearing on the host makes a browser there (the console, on the server's own
	// machine) abort its requests in flight (Chromium: net::ERR_NETWORK_CHANGED), and these spares start while the
	// sandbox's run_code is in flight. The fork that claims them makes their ports, beside its clones.
	r.refillSpares(f, k, limitsOf(limits), false)
}

// admitAhead decides whether a family may be granted k spares at now, within budget, given when the families
// holding spares got them (oldest first): ok, after the oldest evict of them give theirs up (each held at least
// aheadMinHold).
func admitAhead(held []time.Time, k, budget int, now time.Time) (evict int, ok bool) {
	if k <= 0 || k > budget {
		return 0, false
	}
	for (len(held)-evict+1)*k > budget {
		if evict == len(held) || now.Sub(held[evict]) < aheadMinHold {
			return 0, false
		}
		evict++
	}
	return evict, true
}

// forked takes family f out of the budget for good: its spares are its own from its first fork on.
func (r *Runtime) forked(f *family) {
	a := &r.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	if f.ahead.forked {
		return
	}
	f.ahead = aheadState{forked: true}
	a.granted = slices.DeleteFunc(a.granted, func(g *family) bool { return g == f })
}

// retireSpares ends the spares placed in family f (their cgroups and ports with them) that no fork has taken.
func (r *Runtime) retireSpares(f *family) {
	f.pool.refill.Lock() // not while a refill is placing them
	defer f.pool.refill.Unlock()
	if r.wantsSpares(f) {
		return // granted anew, or forked, since it gave them up
	}
	f.pool.mu.Lock()
	var gone []placedSpare
	for pid, sp := range f.pool.placed {
		gone = append(gone, sp)
		delete(f.pool.placed, pid)
	}
	f.pool.mu.Unlock()
	for _, sp := range gone {
		if cg, err := r.cfg.Cgroups.Load(sp.cgroup); err == nil {
			if err := cg.Kill(context.Background()); err != nil {
				r.log.Warn("retire spare agent", "family", f.id, "spare", sp.nsPid, "err", err)
				continue
			}
			cg.Delete() //nolint:errcheck // empty now; the family's end removes it otherwise
		}
		if sp.port != "" && r.cfg.Network != nil {
			r.cfg.Network.Detach(sp.port) //nolint:errcheck // gone with its namespace: not an error
		}
	}
}

// wantsSpares reports whether family f is to keep spares: it has forked, or holds a share of the budget.
func (r *Runtime) wantsSpares(f *family) bool {
	r.ahead.mu.Lock()
	defer r.ahead.mu.Unlock()
	return f.ahead.forked || f.ahead.granted
}

// hasEnded reports whether the family has ended (family.kill).
func (f *family) hasEnded() bool {
	f.pool.life.RLock()
	defer f.pool.life.RUnlock()
	return f.pool.ended
}
