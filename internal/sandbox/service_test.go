package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/store"
)

// TestLifecycle drives every operation once through the service: create, run_code, files, fork, diff, merge,
// pause, resume, fork of a paused sandbox, delete.
func TestLifecycle(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create()
	e.run(a, "x = 1")
	if got := e.run(a, "x"); got != "1" {
		t.Fatalf("x = %q", got)
	}
	res, err := e.svc.Exec(ctx, a, ExecRequest{Cmd: "exit 3"}, nil)
	if err != nil || res.ExitCode != 3 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	fc, err := e.svc.Files(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	fc.Release()
	upper := e.rt.UpperDir(e.rt.Get(a).Handle())
	os.MkdirAll(filepath.Join(upper, "root"), 0o755)
	os.WriteFile(filepath.Join(upper, "root", "f"), []byte("one"), 0o644)

	fr, err := e.svc.Fork(ctx, a, 2)
	if err != nil {
		t.Fatal(err)
	}
	k1, k2 := fr.Children[0], fr.Children[1]
	if got := e.run(k1, "x"); got != "1" {
		t.Fatalf("child's x = %q", got)
	}
	e.run(k1, "x = 2")
	os.WriteFile(filepath.Join(e.rt.UpperDir(e.rt.Get(k1).Handle()), "root", "g"), []byte("two"), 0o644)
	d, err := e.svc.Diff(ctx, a, k1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Added) != 1 || d.Added[0] != "/root/g" {
		t.Fatalf("diff: %+v", d)
	}
	if err := e.svc.MergeInto(ctx, a, k1); err != nil {
		t.Fatal(err)
	}
	if got := e.run(a, "x"); got != "2" {
		t.Fatalf("merged x = %q", got)
	}
	if _, err := e.svc.Get(ctx, k1); err == nil {
		t.Fatal("winner still answers")
	}

	if _, accepted, err := e.svc.Pause(ctx, a); err != nil || !accepted {
		t.Fatalf("pause: %v %v", accepted, err)
	}
	e.waitFor(a, StatusPaused)
	if e.rt.Get(a) != nil {
		t.Fatal("paused sandbox still runs")
	}
	pf, err := e.svc.ForkWith(ctx, a, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range pf.Children {
		if st := e.status(c); st != StatusPaused {
			t.Fatalf("paused fork child is %s", st)
		}
	}
	if _, _, err := e.svc.Resume(ctx, a); err != nil {
		t.Fatal(err)
	}
	e.waitFor(a, StatusRunning)
	if got := e.run(a, "x"); got != "2" {
		t.Fatalf("resumed x = %q", got)
	}
	if b, err := os.ReadFile(filepath.Join(e.rt.UpperDir(e.rt.Get(a).Handle()), "root", "g")); err != nil || string(b) != "two" {
		t.Fatalf("resumed file: %q %v", b, err)
	}
	for _, id := range append([]string{a, k2}, pf.Children...) {
		if err := e.svc.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if ids := e.ids(); len(ids) != 0 {
		t.Fatalf("left: %v", ids)
	}
	if left := e.rt.IDs(); len(left) != 0 {
		t.Fatalf("runtime still holds %v", left)
	}
	// A deleted paused sandbox's snapshot goes in the background (dropSnapshot).
	deadline := time.Now().Add(5 * time.Second)
	for left := e.snaps.Keys(); len(left) != 0; left = e.snaps.Keys() {
		if time.Now().After(deadline) {
			t.Fatalf("snapshots left: %v", left)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// poolSize is how many warm sandboxes are ready.
func (e *env) poolSize() int {
	e.svc.mu.Lock()
	defer e.svc.mu.Unlock()
	return len(e.svc.warm)
}

// waitPool waits until the pool holds n ready sandboxes (it has no notification of its own; this polls a
// condition, it asserts no timing).
func (e *env) waitPool(n int) []string {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for e.poolSize() != n {
		if time.Now().After(deadline) {
			e.t.Fatalf("the pool has %d sandboxes, want %d", e.poolSize(), n)
		}
		time.Sleep(time.Millisecond)
	}
	e.svc.mu.Lock()
	defer e.svc.mu.Unlock()
	var ids []string
	for _, w := range e.svc.warm {
		ids = append(ids, w.rec.ID)
	}
	return ids
}

// TestWarmPool: the pool fills, is invisible to the API, gives Create a configured sandbox and refills; Close
// destroys the warm sandboxes, and a restart destroys warm ones a crashed server left.
func TestWarmPool(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WarmPool = 2 })
	warm := e.waitPool(2)
	if ids := e.ids(); len(ids) != 0 {
		t.Fatalf("warm sandboxes are listed: %v", ids)
	}
	in, err := e.svc.Create(context.Background(), CreateRequest{Env: map[string]string{"A": "1"}, Cwd: "/tmp"})
	if err != nil {
		t.Fatal(err)
	}
	if in.ID != warm[0] && in.ID != warm[1] {
		t.Fatalf("create did not take a warm sandbox: %s not in %v", in.ID, warm)
	}
	if sp := e.rt.Get(in.ID).Spec; sp.Env["A"] != "1" || sp.Cwd != "/tmp" {
		t.Fatalf("the claimed sandbox was not configured: %+v", sp)
	}
	if got := e.run(in.ID, "x = 1"); got != "" {
		t.Fatal(got)
	}
	e.waitPool(2)
	e.svc.Close()
	if left := e.rt.IDs(); len(left) != 1 || left[0] != in.ID {
		t.Fatalf("after Close the runtime holds %v, want only %s", left, in.ID)
	}
	// A crashed server leaves warm records and sandboxes: the next start destroys them.
	e.start()
	crashed := e.waitPool(2)
	e.svc.mu.Lock()
	e.svc.closing = true // as if killed: Close would destroy the warm sandboxes itself
	e.svc.mu.Unlock()
	e.svc.cancel()
	e.svc.wg.Wait()
	e.cfg.WarmPool = 0
	e.start()
	for _, id := range crashed {
		if e.rt.Get(id) != nil {
			t.Errorf("warm sandbox %s of the crashed server survived the restart", id)
		}
		if _, err := e.store.Get(context.Background(), id); err == nil {
			t.Errorf("warm record %s of the crashed server survived the restart", id)
		}
	}
	if got := e.run(in.ID, "x"); got != "1" {
		t.Fatalf("the claimed sandbox lost its state across restarts: %q", got)
	}
}

// TestRestartRecovery: at start the service re-attaches what still runs and marks the rest: lost sandboxes and
// interrupted creations become error, an interrupted pause either keeps running or (snapshot complete) is
// paused; paused ones stay paused and resume.
func TestRestartRecovery(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	alive, lost, paused, pausingAlive, pausingDone := e.create(), e.create(), e.create(), e.create(), e.create()
	e.run(alive, "x = alive")
	e.run(paused, "x = paused")
	if _, _, err := e.svc.Pause(ctx, paused); err != nil {
		t.Fatal(err)
	}
	e.waitFor(paused, StatusPaused)
	if _, _, err := e.svc.Pause(ctx, pausingDone); err != nil {
		t.Fatal(err)
	}
	e.waitFor(pausingDone, StatusPaused)
	e.svc.Close()

	// What a crash leaves: a creation cut short, pauses cut short, a sandbox whose processes died.
	e.rt.Kill(lost)
	creating := NewID()
	put := func(id string, st Status) {
		rec, err := e.store.Get(ctx, id)
		if err != nil {
			rec = store.Record{ID: id, FamilyID: "fam_" + id[4:], IP: "10.99.250.1", Hostname: hostnameOf(id), CreatedAt: time.Now().UTC(), Spec: []byte("{}")}
		}
		rec.Status = string(st)
		if err := e.store.Put(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	put(creating, StatusCreating)
	put(pausingAlive, StatusPausing)
	put(pausingDone, StatusPausing) // its snapshot was recorded, its sandbox already freed
	e.start()

	want := map[string]Status{alive: StatusRunning, lost: StatusError, paused: StatusPaused, creating: StatusError,
		pausingAlive: StatusRunning, pausingDone: StatusPaused}
	for id, st := range want {
		if got := e.status(id); got != st {
			t.Errorf("%s recovered as %s, want %s", id, got, st)
		}
	}
	if got := e.run(alive, "x"); got != "alive" {
		t.Errorf("recovered sandbox lost its state: %q", got)
	}
	if in, _ := e.svc.Get(ctx, pausingAlive); in.Pause == nil || in.Pause.Error == "" {
		t.Errorf("an interrupted pause is not reported: %+v", in.Pause)
	}
	if _, _, err := e.svc.Resume(ctx, paused); err != nil {
		t.Fatal(err)
	}
	e.waitFor(paused, StatusRunning)
	if got := e.run(paused, "x"); got != "paused" {
		t.Errorf("resumed after a restart: x = %q", got)
	}
	// A lost sandbox can still be deleted.
	for _, id := range []string{lost, creating} {
		if err := e.svc.Delete(ctx, id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
}
