package sandbox

import (
	"context"
	"slices"
	"testing"
	"time"
)

// aheadEnv is a service that makes up to limit children ahead of forks.
func aheadEnv(t *testing.T, limit int) *env {
	return newEnv(t, func(c *Config) { c.ForkAhead = limit })
}

// aheadReady is a service making up to 8 children ahead, with a sandbox that forked n children and has n
// children made ahead ready.
func aheadReady(t *testing.T, n int) (*env, string) {
	e := aheadEnv(t, 8)
	p := e.create()
	e.fork(p, n, false)
	e.waitAhead(n)
	return e, p
}

// waitAhead waits until n children made ahead are ready, or fails.
func (e *env) waitAhead(n int) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.svc.Stats().Ahead < n {
		if time.Now().After(deadline) {
			e.t.Fatalf("children made ahead: %+v, want %d ready", e.svc.Stats(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fork forks id into n children and deletes them again unless keep; it returns the result.
func (e *env) fork(id string, n int, keep bool) ForkResult {
	e.t.Helper()
	fr, err := e.svc.Fork(context.Background(), id, n)
	if err != nil {
		e.t.Fatalf("fork %s: %v", id, err)
	}
	if len(fr.Children) != n {
		e.t.Fatalf("fork %s: %d children, want %d", id, len(fr.Children), n)
	}
	if !keep {
		for _, k := range fr.Children {
			if err := e.svc.Delete(context.Background(), k); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	return fr
}

func TestForkAheadServesTheNextForkOfAStillParent(t *testing.T) {
	e := aheadEnv(t, 8)
	p := e.create()
	e.run(p, "x = 1")
	if fr := e.fork(p, 3, false); fr.MadeAhead {
		t.Fatal("a sandbox's first fork was made ahead")
	}
	e.waitAhead(3)
	if slices.Contains(e.ids(), "") || len(e.ids()) != 1 {
		t.Fatalf("children made ahead are listed: %v", e.ids())
	}
	fr := e.fork(p, 2, true)
	if !fr.MadeAhead {
		t.Fatal("the fork did not use the children made ahead")
	}
	for _, k := range fr.Children {
		if v := e.run(k, "x"); v != "1" {
			t.Fatalf("child %s: x = %q", k, v)
		}
		in, err := e.svc.Get(context.Background(), k)
		if err != nil || in.ParentID == nil || *in.ParentID != p || in.Status != StatusRunning {
			t.Fatalf("child %s: %+v %v", k, in, err)
		}
	}
	want := append([]string{p}, fr.Children...)
	slices.Sort(want)
	if got := e.ids(); !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	st := e.svc.Stats()
	if st.AheadMade != 3 || st.AheadUsed != 2 {
		t.Fatalf("stats %+v: want 3 made, 2 used", st)
	}
	e.waitRuntime(3, "the parent and its two children: the third child made ahead dropped")
}

// waitRuntime waits until the runtime holds n sandboxes, or fails saying what they should be.
func (e *env) waitRuntime(n int, what string) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(e.rt.IDs()) != n {
		if time.Now().After(deadline) {
			e.t.Fatalf("runtime holds %v, want %s", e.rt.IDs(), what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestForkAheadDroppedWhenTheParentChanges(t *testing.T) {
	e := aheadEnv(t, 8)
	p := e.create()
	e.run(p, "x = 1")
	e.fork(p, 2, false)

	// Through a call: dropped before the call runs.
	e.waitAhead(2)
	e.run(p, "x = 2")
	if st := e.svc.Stats(); st.Ahead != 0 {
		t.Fatalf("after a run_code on the parent: %+v", st)
	}
	fr := e.fork(p, 2, true)
	if fr.MadeAhead {
		t.Fatal("children made before a run_code were used")
	}
	for _, k := range fr.Children {
		if v := e.run(k, "x"); v != "2" {
			t.Fatalf("child: x = %q, want 2", v)
		}
		e.svc.Delete(context.Background(), k) //nolint:errcheck
	}

	// On its own (a thread, a background process): the mark moved, so the fork makes fresh children.
	e.waitAhead(2)
	e.rt.Stir(p, "x", "3")
	fr = e.fork(p, 2, true)
	if fr.MadeAhead {
		t.Fatal("children made before the parent changed on its own were used")
	}
	for _, k := range fr.Children {
		if v := e.run(k, "x"); v != "3" {
			t.Fatalf("child: x = %q, want 3", v)
		}
	}
	if st := e.svc.Stats(); st.AheadDropped != 4 || st.AheadUsed != 0 {
		t.Fatalf("stats %+v: want 4 dropped, none used", st)
	}
}

func TestForkAheadBounded(t *testing.T) {
	e := aheadEnv(t, 4)
	p := e.create()
	// More children than the limit: none made ahead.
	e.fork(p, 5, false)
	time.Sleep(3 * aheadIdle)
	if st := e.svc.Stats(); st.AheadMade != 0 {
		t.Fatalf("made ahead for a fork of 5 with a limit of 4: %+v", st)
	}
	// Overrides (here: another egress) are not what children made ahead have: the fork makes its own.
	e.fork(p, 2, false)
	e.waitAhead(2)
	none := []string{}
	fr, err := e.svc.ForkWithOptions(context.Background(), p, 2, ForkOptions{Egress: &none})
	if err != nil || fr.MadeAhead {
		t.Fatalf("fork with egress override: %+v %v", fr, err)
	}
	// Two sets left unused in a row (the first: what the fork with overrides did not take), then no more until
	// the sandbox forks again without overrides.
	e.run(p, "y = 1")
	for range aheadTries - 1 {
		e.waitAhead(2)
		e.run(p, "y = 1")
	}
	made := e.svc.Stats().AheadMade
	time.Sleep(3 * aheadIdle)
	if st := e.svc.Stats(); st.AheadMade != made || st.Ahead != 0 {
		t.Fatalf("more children made ahead after %d unused sets: %+v", aheadTries+1, st)
	}
	e.fork(p, 2, false)
	e.waitAhead(2)
}

func TestForkAheadLeavesNothingAtClose(t *testing.T) {
	e, p := aheadReady(t, 3)
	e.svc.Close()
	for _, id := range e.rt.IDs() {
		if id != p {
			t.Errorf("left running after Close: %s", id)
		}
	}
}

func TestForkAheadParentDeleted(t *testing.T) {
	e, p := aheadReady(t, 2)
	if err := e.svc.Delete(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	// Gone when the delete returns: the family goes with its last listed sandbox.
	if ids := e.rt.IDs(); len(ids) != 0 {
		t.Fatalf("runtime holds %v after the parent's delete", ids)
	}
	if st := e.svc.Stats(); st.Ahead != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestForkAheadDroppedWhenAChildIsLost(t *testing.T) {
	e, p := aheadReady(t, 2)
	for _, id := range e.rt.IDs() {
		if id != p {
			e.rt.Kill(id)
			break
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for st := e.svc.Stats(); st.Ahead != 0 || st.AheadDropped != 2; st = e.svc.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("a lost child made ahead did not drop its set: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if fr := e.fork(p, 2, false); fr.MadeAhead {
		t.Fatal("the fork took a set with a lost child")
	}
}

// A keepalive changes nothing children made ahead hold: they stay, and take the parent's timeout at the fork.
func TestForkAheadKeptByAKeepalive(t *testing.T) {
	e, p := aheadReady(t, 2)
	if _, err := e.svc.SetTimeout(context.Background(), p, 600); err != nil {
		t.Fatal(err)
	}
	fr := e.fork(p, 2, true)
	if !fr.MadeAhead {
		t.Fatal("a keepalive dropped the children made ahead")
	}
	for _, k := range fr.Children {
		in, err := e.svc.Get(context.Background(), k)
		if err != nil || in.TimeoutS != 600 {
			t.Fatalf("child %s: %+v %v, want timeout_s 600 (the parent's at the fork)", k, in, err)
		}
	}
}

// Sets being made count against the limit: two sandboxes whose sets are made at the same time do not both get
// one past it.
func TestForkAheadLimitHoldsForSetsMadeTogether(t *testing.T) {
	e := aheadEnv(t, 4)
	a, b := e.create(), e.create()
	e.fork(a, 3, false)
	e.fork(b, 3, false)
	e.rt.SetFault(func(_ context.Context, method, _ string) error {
		if method == "Fork" {
			time.Sleep(3 * aheadIdle) // both sets under way at once
		}
		return nil
	})
	e.waitAhead(3)
	time.Sleep(6 * aheadIdle)
	if st := e.svc.Stats(); st.Ahead != 3 || st.AheadMade != 3 {
		t.Fatalf("stats %+v: want one set of 3 within the limit of 4", st)
	}
}

// TestForkAheadNotForSessionsWithForkHooks: a sandbox whose session registered at-fork handlers that a fork made
// ahead must not run (the fake's "fork_hooks" variable stands for them) gets no children made ahead, fork after
// fork, while a sandbox beside it does; its forks make their own children.
func TestForkAheadNotForSessionsWithForkHooks(t *testing.T) {
	e := aheadEnv(t, 8)
	hooked, plain := e.create(), e.create()
	e.run(hooked, "fork_hooks = 1")
	for round := range 2 {
		if fr := e.fork(hooked, 2, false); fr.MadeAhead {
			t.Fatalf("round %d: the fork of a session with fork handlers took children made ahead", round)
		}
		e.fork(plain, 2, false)
		e.waitAhead(2) // the plain sandbox's, made after its idle time as the hooked one's would be
		time.Sleep(3 * aheadIdle)
		if n := e.svc.Stats().Ahead; n != 2 {
			t.Fatalf("round %d: %d children made ahead, want only the plain sandbox's 2", round, n)
		}
		if fr := e.fork(plain, 2, false); !fr.MadeAhead {
			t.Fatalf("round %d: the plain sandbox's fork did not take its children made ahead", round)
		}
	}
}
