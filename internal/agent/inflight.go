package agent

import (
	"context"
	"errors"
	"sync"
)

// ErrInterrupted is the cause with which an interrupt ends the contexts of the calls it stops.
var ErrInterrupted = errors.New("interrupted")

// CallSet tracks the run_code and exec calls the agent is serving, so that an interrupt can stop them: it ends
// their contexts with ErrInterrupted, and each call stops as it does when its caller goes away (run_code: SIGINT,
// then the interpreter killed after a grace period; exec: its command and everything it started killed).
type CallSet struct {
	mu    sync.Mutex
	calls map[*inflight]struct{}
}

type inflight struct {
	op     string
	cancel context.CancelCauseFunc
}

// Begin registers a call of op (OpRunCode or OpExec); end unregisters it. The zero CallSet is ready to use.
func (s *CallSet) Begin(ctx context.Context, op string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	c := &inflight{op: op, cancel: cancel}
	s.mu.Lock()
	if s.calls == nil {
		s.calls = map[*inflight]struct{}{}
	}
	s.calls[c] = struct{}{}
	s.mu.Unlock()
	return ctx, func() {
		s.mu.Lock()
		delete(s.calls, c)
		s.mu.Unlock()
		cancel(nil)
	}
}

// Interrupt stops every call in flight of the kind what names (InterruptAll: both) and counts them.
func (s *CallSet) Interrupt(what string) Interrupted {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n Interrupted
	for c := range s.calls {
		if what != InterruptAll && what != c.op {
			continue
		}
		c.cancel(ErrInterrupted)
		delete(s.calls, c) // counted once, even if interrupted again before it ends
		if c.op == OpRunCode {
			n.RunCode++
		} else {
			n.Exec++
		}
	}
	return n
}
