package sandbox

import "sort"

// lockMode is how an operation holds a sandbox.
type lockMode int

const (
	// shared: uses that may run side by side (run_code, exec, files, diff).
	shared lockMode = iota
	// exclusive: lifecycle changes (fork, merge, pause, resume, delete, a warm claim); in-flight uses finish
	// first and later calls wait.
	exclusive
)

// acquire is the one way an operation takes sandboxes: it looks up ids (in any order, repeats allowed), locks
// them in mode in id order — the one global order every caller uses, so no two callers can each hold what the
// other waits for — and then, under s.mu, fails with not found if one was destroyed or merged away meanwhile,
// and checks op against the state table for each, in the order of ids. It returns the entries in the order of
// ids and the function that releases them.
func (s *Service) acquire(mode lockMode, op Op, ids ...string) ([]*entry, func(), error) {
	es := make([]*entry, len(ids))
	for i, id := range ids {
		e, err := s.lookup(id)
		if err != nil {
			return nil, nil, err
		}
		es[i] = e
	}
	release, err := s.acquireEntries(mode, func(e *entry) error { return check(op, Status(e.rec.Status)) }, es...)
	if err != nil {
		return nil, nil, err
	}
	// Children made ahead (ahead.go) start from the state the sandbox had when they were made: a call that may
	// change it drops them first (a fork takes them; a diff or a keepalive changes nothing they hold), and its
	// end plans the next ones.
	if op != OpFork && op != OpDiff && op != OpSetTimeout {
		s.dropAheads(es, op)
	}
	return es, func() { release(); s.planAheads(es) }, nil
}

// acquireEntries is acquire for entries already in hand, with admit (called under s.mu, for each entry that is
// not gone) in place of the table check.
func (s *Service) acquireEntries(mode lockMode, admit func(*entry) error, es ...*entry) (func(), error) {
	order := make([]*entry, 0, len(es))
	seen := map[*entry]bool{}
	for _, e := range es {
		if !seen[e] {
			seen[e] = true
			order = append(order, e)
		}
	}
	// rec.ID never changes after an entry is made, so it is read without s.mu.
	sort.Slice(order, func(i, j int) bool { return order[i].rec.ID < order[j].rec.ID })
	for _, e := range order {
		if mode == exclusive {
			e.op.Lock()
		} else {
			e.op.RLock()
		}
	}
	release := func() {
		for i := len(order) - 1; i >= 0; i-- {
			if mode == exclusive {
				order[i].op.Unlock()
			} else {
				order[i].op.RUnlock()
			}
		}
	}
	s.mu.Lock()
	err := func() error {
		for _, e := range es {
			if e.gone {
				return s.notFound(e.rec.ID)
			}
		}
		for _, e := range es {
			if err := admit(e); err != nil {
				return err
			}
		}
		return nil
	}()
	s.mu.Unlock()
	if err != nil {
		release()
		return nil, err
	}
	return release, nil
}
