package sandbox

import (
	"fmt"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// Status is a sandbox's lifecycle state.
type Status string

// The lifecycle states. A destroyed sandbox has no record.
const (
	StatusCreating Status = "creating"
	StatusRunning  Status = "running"
	StatusPausing  Status = "pausing"
	StatusPaused   Status = "paused"
	StatusResuming Status = "resuming"
	StatusError    Status = "error"
	// StatusWarm marks a pre-started sandbox in the warm pool: not visible through the API until claimed.
	StatusWarm Status = "warm"
)

// Op is an operation whose permission depends on the state.
type Op string

// Operations checked against the table.
const (
	OpUse        Op = "use" // run_code, exec, files
	OpFork       Op = "fork"
	OpMerge      Op = "merge"
	OpPause      Op = "pause"
	OpResume     Op = "resume"
	OpDestroy    Op = "destroy"
	OpDiff       Op = "diff"
	OpRestart    Op = "restart"      // the service reviving a sandbox whose agent died (health.go)
	OpSetTimeout Op = "set timeout"  // keepalive: a new deadline (keepalive.go)
	OpTemplate   Op = "template"     // save a template of the sandbox (template.go)
	OpSSHKeys    Op = "add ssh keys" // authorize more SSH keys (ssh.go)
)

// allowed is the one table every handler asks: which operation may start in which state.
var allowed = map[Op]map[Status]bool{
	OpUse:        {StatusRunning: true},
	OpFork:       {StatusRunning: true, StatusPaused: true},
	OpMerge:      {StatusRunning: true},
	OpPause:      {StatusRunning: true},
	OpResume:     {StatusPaused: true, StatusError: true},
	OpDestroy:    {StatusRunning: true, StatusPaused: true, StatusError: true, StatusCreating: true},
	OpDiff:       {StatusRunning: true},
	OpRestart:    {StatusRunning: true},
	OpSetTimeout: {StatusRunning: true, StatusPaused: true},
	OpTemplate:   {StatusRunning: true},
	OpSSHKeys:    {StatusRunning: true, StatusPaused: true},
}

// transitions lists the legal status changes; setStatus refuses any other. A record is born creating (a new
// sandbox or a fork child), warm (a pool sandbox) or paused (a child of a paused sandbox), and a destroyed
// sandbox has no record, so neither birth nor death is a transition.
var transitions = map[Status][]Status{
	StatusCreating: {StatusRunning, StatusError},               // started; failed, or interrupted by a restart
	StatusWarm:     {StatusRunning},                            // claimed by a create
	StatusRunning:  {StatusPausing, StatusError},               // pause begins; lost at a restart or for good
	StatusPausing:  {StatusPaused, StatusRunning, StatusError}, // done; failed (keeps running); lost at a restart
	StatusPaused:   {StatusResuming},
	StatusResuming: {StatusRunning, StatusPaused, StatusError}, // done; failed, snapshot kept (resumeFailure); snapshot broken
	StatusError:    {StatusResuming},
}

// check returns an ErrConflict error when op may not start in status s.
func check(op Op, s Status) error {
	if allowed[op][s] {
		return nil
	}
	switch op {
	case OpUse, OpPause, OpMerge, OpDiff, OpTemplate:
		return errdefs.New(errdefs.ErrConflict, "sandbox is not running")
	case OpResume:
		return errdefs.New(errdefs.ErrConflict, "sandbox is not paused or in error")
	case OpSetTimeout:
		return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("cannot set the timeout of a sandbox that is %s (only running or paused)", s))
	}
	return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("cannot %s a sandbox that is %s", op, s))
}

// TransitionError is a status change the transition table does not allow. It is a conflict (409): like runc's
// state machine, the service refuses to move a sandbox along an edge the table lacks rather than corrupt it.
type TransitionError struct {
	ID       string
	From, To Status
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("sandbox %s is %s and cannot become %s", e.ID, e.From, e.To)
}

// Unwrap makes a TransitionError match errdefs.ErrConflict.
func (e *TransitionError) Unwrap() error { return errdefs.ErrConflict }

// canTransition reports whether from → to is legal.
func canTransition(from, to Status) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// transition returns a *TransitionError unless from → to is in the table.
func transition(id string, from, to Status) error {
	if !canTransition(from, to) {
		return &TransitionError{ID: id, From: from, To: to}
	}
	return nil
}

// setStatus is the one place a sandbox's status changes: it consults the transition table, records the new
// status, wakes whoever waits for a change of this sandbox (Wait) and publishes the change's event (an error
// event carries e.rec.Error: set it first). The caller holds s.mu.
func (s *Service) setStatus(e *entry, to Status) error {
	if err := transition(e.rec.ID, Status(e.rec.Status), to); err != nil {
		return err
	}
	from := Status(e.rec.Status)
	e.rec.Status = string(to)
	s.notify(e)
	s.emitStatus(e, from, to)
	return nil
}

// notify wakes the waiters of e. The caller holds s.mu.
func (s *Service) notify(e *entry) {
	if e.changed != nil {
		close(e.changed)
		e.changed = nil
	}
}

// changes returns a channel closed at e's next status change or retirement. The caller holds s.mu.
func (s *Service) changes(e *entry) <-chan struct{} {
	if e.changed == nil {
		e.changed = make(chan struct{})
	}
	return e.changed
}
