package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"
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
	fs, release, err := e.svc.Files(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	release()
	_ = fs
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
	if left := e.snaps.Keys(); len(left) != 0 {
		t.Fatalf("snapshots left: %v", left)
	}
}
