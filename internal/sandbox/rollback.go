package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// rollbackTimeout bounds how long undoing a failed operation may take.
const rollbackTimeout = time.Minute

// undoStack records what a multi-step operation (create, fork, fork of a paused sandbox) has done, so that a
// failure undoes exactly that, newest first: the operation leaves nothing behind or completes.
type undoStack struct {
	steps []undoStep
}

type undoStep struct {
	what string
	do   func(ctx context.Context) error
}

// push records how to undo a step that has just succeeded.
func (u *undoStack) push(what string, do func(ctx context.Context) error) {
	u.steps = append(u.steps, undoStep{what, do})
}

// rollback undoes every recorded step, newest first, and forgets them. It runs even when ctx has ended (the
// failure being handled is often that very cancellation): the steps get a context with ctx's values but not its
// cancellation, bounded by rollbackTimeout. Every step is tried; their errors come back joined.
func (u *undoStack) rollback(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	var errs []error
	for i := len(u.steps) - 1; i >= 0; i-- {
		if err := u.steps[i].do(ctx); err != nil {
			errs = append(errs, fmt.Errorf("undo %s: %w", u.steps[i].what, err))
		}
	}
	u.steps = nil
	return errors.Join(errs...)
}

// fail rolls u back after err and returns err, joined with what the rollback could not undo (also logged).
func (s *Service) fail(ctx context.Context, u *undoStack, err error) error {
	if rerr := u.rollback(ctx); rerr != nil {
		s.log.Error("rollback left something behind", "err", err, "rollback", rerr)
		return errors.Join(err, rerr)
	}
	return err
}
