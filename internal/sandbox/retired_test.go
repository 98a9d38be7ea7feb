package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// An id that is gone answers 404 with what became of it: merged into which sandbox (following later merges),
// or deleted, and why; across a restart too.
func TestRetiredIDsSayWhatBecameOfThem(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	p := e.create()
	fork := func(id string) string {
		t.Helper()
		res, err := e.svc.Fork(ctx, id, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res.Children[0]
	}
	c := fork(p)
	d := fork(c)
	if err := e.svc.MergeInto(ctx, c, d); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.MergeInto(ctx, p, c); err != nil {
		t.Fatal(err)
	}
	gone := e.create()
	if err := e.svc.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for _, tc := range []struct{ id, want string }{
			{d, "was merged into " + c},
			{d, "and " + c + " since into " + p + "; its state lives on under " + p + ": use id " + p},
			{c, "was merged into " + p},
			{gone, "was deleted at"},
			{"sbx_0123456789abcdef0123456789abcdef", "sandbox not found"},
		} {
			_, err := e.svc.Get(ctx, tc.id)
			if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(errdefs.Message(err), tc.want) {
				t.Errorf("%s: Get(%s) = %v, want not found saying %q", when, tc.id, err, tc.want)
			}
		}
		if _, err := e.svc.Get(ctx, p); err != nil {
			t.Errorf("%s: the parent: %v", when, err)
		}
	}
	check("before a restart")
	e.svc.Close()
	e.start()
	check("after a restart")
}
