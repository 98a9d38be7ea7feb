package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// A template captures a running sandbox (variables and files) and leaves it running; sandboxes created from it
// have their own ids and addresses, the captured state, the template's spec unless overridden, and are
// independent; the template survives a restart and its delete removes its snapshot.
func TestTemplateCaptureCreateDelete(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	src, err := e.svc.Create(ctx, CreateRequest{MemMiB: 512, Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	e.run(src.ID, "x = 41")
	upper := e.rt.UpperDir(e.rt.Get(src.ID).Handle())
	os.MkdirAll(filepath.Join(upper, "root"), 0o755)
	os.WriteFile(filepath.Join(upper, "root", "f"), []byte("data"), 0o644)

	tp, err := e.svc.SaveTemplate(ctx, "prepared", src.ID)
	if err != nil {
		t.Fatal(err)
	}
	if tp.Name != "prepared" || tp.From != src.ID || tp.Size <= 0 || tp.Spec.MemMiB != 512 {
		t.Fatalf("template: %+v", tp)
	}
	// The source runs on, unchanged and usable.
	if st := e.status(src.ID); st != StatusRunning {
		t.Fatalf("source is %s after the capture", st)
	}
	e.run(src.ID, "x = 0")

	var kids []Info
	for i := 0; i < 3; i++ {
		over := CreateRequest{Template: "prepared"}
		if i == 2 {
			over.MemMiB = 256
		}
		in, err := e.svc.Create(ctx, over)
		if err != nil {
			t.Fatalf("create %d from the template: %v", i, err)
		}
		kids = append(kids, in)
	}
	seen := map[string]bool{src.ID: true, src.IP: true}
	for i, k := range kids {
		if seen[k.ID] || seen[k.IP] || k.Template != "prepared" || k.Status != StatusRunning {
			t.Fatalf("child %d: %+v", i, k)
		}
		seen[k.ID], seen[k.IP] = true, true
		if want := map[bool]int{true: 256, false: 512}[i == 2]; k.MemMiB != want || k.Metadata["k"] != "v" {
			t.Fatalf("child %d: mem_mib %d (want %d), metadata %v", i, k.MemMiB, want, k.Metadata)
		}
		if got := e.run(k.ID, "x"); got != "41" {
			t.Fatalf("child %d: x = %q", i, got)
		}
		b, err := os.ReadFile(filepath.Join(e.rt.UpperDir(e.rt.Get(k.ID).Handle()), "root", "f"))
		if err != nil || string(b) != "data" {
			t.Fatalf("child %d: file %q %v", i, b, err)
		}
	}
	e.run(kids[0].ID, "x = 1")
	if got := e.run(kids[1].ID, "x"); got != "41" {
		t.Fatalf("children are not independent: x = %q", got)
	}

	if _, err := e.svc.SaveTemplate(ctx, "prepared", src.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second capture under the same name: %v, want conflict", err)
	}
	e.svc.Close()
	e.start()
	ts, err := e.svc.ListTemplates(ctx)
	if err != nil || len(ts) != 1 || ts[0].Name != "prepared" {
		t.Fatalf("templates after a restart: %+v %v", ts, err)
	}
	in, err := e.svc.Create(ctx, CreateRequest{Template: "prepared"})
	if err != nil {
		t.Fatalf("create after a restart: %v", err)
	}
	if got := e.run(in.ID, "x"); got != "41" {
		t.Fatalf("after a restart: x = %q", got)
	}
	if err := e.svc.DeleteTemplate(ctx, "prepared"); err != nil {
		t.Fatal(err)
	}
	if objs, _ := e.snaps.List(ctx, "templates/"); len(objs) != 0 {
		t.Fatalf("snapshot objects left after the delete: %v", objs)
	}
	if err := e.svc.DeleteTemplate(ctx, "prepared"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second delete: %v, want not found", err)
	}
	if _, err := e.svc.Create(ctx, CreateRequest{Template: "prepared"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("create from a deleted template: %v, want not found", err)
	}
	if got := e.run(kids[1].ID, "x"); got != "41" {
		t.Fatalf("a child after its template's delete: x = %q", got)
	}
}

func TestTemplateErrors(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	a := e.create()
	for _, name := range []string{"", "Upper", "-x", "a/b", "a b", string(make([]byte, 64))} {
		if _, err := e.svc.SaveTemplate(ctx, name, a); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("name %q: %v, want invalid", name, err)
		}
	}
	if _, err := e.svc.SaveTemplate(ctx, "t", NewID()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown sandbox: %v, want not found", err)
	}
	if _, err := e.svc.GetTemplate(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown template: %v, want not found", err)
	}
	if _, _, err := e.svc.Pause(ctx, a); err != nil {
		t.Fatal(err)
	}
	e.waitFor(a, StatusPaused)
	if _, err := e.svc.SaveTemplate(ctx, "t", a); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("paused sandbox: %v, want conflict", err)
	}
	// A failed capture leaves no template and no snapshot objects, and the sandbox running.
	b := e.create()
	e.snaps.SetFault(func(_ context.Context, op, key string) error {
		if op == "Put" && filepath.Base(key) == "manifest.json" {
			return errors.New("disk full")
		}
		return nil
	})
	if _, err := e.svc.SaveTemplate(ctx, "t", b); err == nil {
		t.Fatal("capture with a failing store succeeded")
	}
	e.snaps.SetFault(nil)
	if objs, _ := e.snaps.List(ctx, "templates/"); len(objs) != 0 {
		t.Fatalf("snapshot objects left by a failed capture: %v", objs)
	}
	if st := e.status(b); st != StatusRunning {
		t.Fatalf("sandbox is %s after a failed capture", st)
	}
	e.run(b, "y = 1")
}

// Captures and creates run side by side with uses, deletes and each other without deadlock or race.
func TestTemplateConcurrency(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	a := e.create()
	e.run(a, "x = 7")
	if _, err := e.svc.SaveTemplate(ctx, "base", a); err != nil {
		t.Fatal(err)
	}
	within(t, 30e9, "concurrent template calls", func() {
		var wg sync.WaitGroup
		for i := 0; i < 4; i++ {
			wg.Add(3)
			go func() {
				defer wg.Done()
				if in, err := e.svc.Create(ctx, CreateRequest{Template: "base"}); err == nil {
					e.svc.Delete(ctx, in.ID)
				} else if !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("create: %v", err)
				}
			}()
			go func() {
				defer wg.Done()
				e.svc.RunCode(ctx, a, RunCodeRequest{Code: "x"}, nil)
			}()
			go func() {
				defer wg.Done()
				_, err := e.svc.SaveTemplate(ctx, "other", a)
				if err != nil && !errors.Is(err, errdefs.ErrConflict) {
					t.Errorf("capture: %v", err)
				}
			}()
		}
		wg.Add(1)
		go func() { defer wg.Done(); e.svc.DeleteTemplate(ctx, "base") }()
		wg.Wait()
	})
	if st := e.status(a); st != StatusRunning {
		t.Fatalf("source is %s", st)
	}
}

// A template snapshot no record names (a capture cut short by a crash) is removed at the next start when the
// store is the server's alone; a recorded template's is kept.
func TestTemplateReclaim(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, func(c *Config) { c.SnapshotsExclusive = true })
	a := e.create()
	if _, err := e.svc.SaveTemplate(ctx, "kept", a); err != nil {
		t.Fatal(err)
	}
	if _, err := e.snaps.Put(ctx, "templates/lost/1/session.bin", strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	e.svc.Close()
	e.start()
	if objs, _ := e.snaps.List(ctx, "templates/lost/"); len(objs) != 0 {
		t.Fatalf("orphan template snapshot kept: %v", objs)
	}
	if objs, _ := e.snaps.List(ctx, "templates/kept/"); len(objs) == 0 {
		t.Fatal("a recorded template's snapshot was reclaimed")
	}
	if _, err := e.svc.Create(ctx, CreateRequest{Template: "kept"}); err != nil {
		t.Fatal(err)
	}
}

// templatePool lists the ids of template name's ready sandboxes once it holds n (polled: the pool has no
// notification of its own; no timing is asserted).
func (e *env) templatePool(name string, n int) []string {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		e.svc.mu.Lock()
		var ids []string
		for _, w := range e.svc.tmplWarm[name] {
			ids = append(ids, w.rec.ID)
		}
		e.svc.mu.Unlock()
		if len(ids) == n {
			return ids
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("template %s's pool has %d sandboxes, want %d", name, len(ids), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// With a template pool, a create from the template claims a sandbox restored ahead of time (configured with
// the request's spec), the pool refills, a restart refills it, and a delete of the template drops it.
func TestTemplatePool(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, func(c *Config) { c.TemplatePool = 1 })
	a := e.create()
	e.run(a, "x = 41")
	if _, err := e.svc.SaveTemplate(ctx, "pooled", a); err != nil {
		t.Fatal(err)
	}
	ready := e.templatePool("pooled", 1)
	if ids := e.ids(); len(ids) != 1 {
		t.Fatalf("the pool's sandbox is visible: %v", ids)
	}
	in, err := e.svc.Create(ctx, CreateRequest{Template: "pooled", MemMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	if in.ID != ready[0] || in.MemMiB != 256 || in.Template != "pooled" || in.Status != StatusRunning {
		t.Fatalf("create from a pooled template: %+v, want the ready %s", in, ready[0])
	}
	if got := e.run(in.ID, "x"); got != "41" {
		t.Fatalf("claimed sandbox: x = %q", got)
	}
	next := e.templatePool("pooled", 1)
	if next[0] == in.ID {
		t.Fatal("the claimed sandbox is still in the pool")
	}
	e.svc.Close()
	e.start()
	restarted := e.templatePool("pooled", 1)
	if err := e.svc.DeleteTemplate(ctx, "pooled"); err != nil {
		t.Fatal(err)
	}
	e.templatePool("pooled", 0)
	if e.rt.Get(restarted[0]) != nil {
		t.Fatalf("the deleted template's ready sandbox %s still exists", restarted[0])
	}
	if got := e.run(in.ID, "x"); got != "41" {
		t.Fatalf("a claimed sandbox after its template's delete: x = %q", got)
	}
}
