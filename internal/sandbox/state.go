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
	OpUse     Op = "use" // run_code, exec, files
	OpFork    Op = "fork"
	OpMerge   Op = "merge"
	OpPause   Op = "pause"
	OpResume  Op = "resume"
	OpDestroy Op = "destroy"
	OpDiff    Op = "diff"
)

// allowed is the one table every handler asks: which operation may start in which state.
var allowed = map[Op]map[Status]bool{
	OpUse:     {StatusRunning: true},
	OpFork:    {StatusRunning: true, StatusPaused: true},
	OpMerge:   {StatusRunning: true},
	OpPause:   {StatusRunning: true},
	OpResume:  {StatusPaused: true, StatusError: true},
	OpDestroy: {StatusRunning: true, StatusPaused: true, StatusError: true, StatusCreating: true},
	OpDiff:    {StatusRunning: true, StatusPaused: true},
}

// transitions lists the legal status changes.
var transitions = map[Status][]Status{
	StatusCreating: {StatusRunning, StatusError},
	StatusRunning:  {StatusPausing, StatusError},
	StatusPausing:  {StatusPaused, StatusRunning, StatusError},
	StatusPaused:   {StatusResuming},
	StatusResuming: {StatusRunning, StatusError},
	StatusError:    {StatusResuming},
}

// check returns an ErrConflict error when op may not start in status s.
func check(op Op, s Status) error {
	if allowed[op][s] {
		return nil
	}
	switch op {
	case OpUse, OpPause, OpMerge:
		return errdefs.New(errdefs.ErrConflict, "sandbox is not running")
	case OpResume:
		return errdefs.New(errdefs.ErrConflict, "sandbox is not paused or in error")
	}
	return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("cannot %s a sandbox that is %s", op, s))
}

// canTransition reports whether from → to is legal.
func canTransition(from, to Status) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}
