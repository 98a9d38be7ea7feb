package sandbox

import (
	"errors"
	"testing"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

func TestCheckTable(t *testing.T) {
	cases := []struct {
		op  Op
		s   Status
		ok  bool
		msg string
	}{
		{OpUse, StatusRunning, true, ""},
		{OpUse, StatusPaused, false, "sandbox is not running"},
		{OpUse, StatusCreating, false, "sandbox is not running"},
		{OpPause, StatusPaused, false, "sandbox is not running"},
		{OpResume, StatusRunning, false, "sandbox is not paused or in error"},
		{OpResume, StatusError, true, ""},
		{OpFork, StatusPaused, true, ""},
		{OpFork, StatusError, false, "cannot fork a sandbox that is error"},
		{OpMerge, StatusPausing, false, "sandbox is not running"},
		{OpDestroy, StatusError, true, ""},
		{OpDestroy, StatusPausing, false, "cannot destroy a sandbox that is pausing"},
	}
	for _, c := range cases {
		err := check(c.op, c.s)
		if (err == nil) != c.ok {
			t.Errorf("check(%s, %s) = %v, want ok=%v", c.op, c.s, err, c.ok)
			continue
		}
		if err != nil {
			if !errors.Is(err, errdefs.ErrConflict) || errdefs.Message(err) != c.msg {
				t.Errorf("check(%s, %s) = %q, want conflict %q", c.op, c.s, errdefs.Message(err), c.msg)
			}
		}
	}
}

func TestTransitions(t *testing.T) {
	if !canTransition(StatusCreating, StatusRunning) || canTransition(StatusPaused, StatusRunning) || canTransition(StatusRunning, StatusCreating) {
		t.Fatal("transition table is wrong")
	}
}
