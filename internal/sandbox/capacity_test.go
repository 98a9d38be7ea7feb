package sandbox

import (
	"context"
	"errors"
	"testing"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// A shape larger than the host is refused (400); past the overcommit limits create, fork and resume answer 503,
// and room made by deleting sandboxes is usable again.
func TestCapacity(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.HostCPUs, c.HostMemMiB = 2, 3072
		c.MemOvercommit, c.CPUOvercommit = 1, 64
	})
	ctx := context.Background()
	for _, bad := range []CreateRequest{{VCPU: 3}, {MemMiB: 4096}, {MaxProcs: 1 << 30}} {
		if _, err := e.svc.Create(ctx, bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("create %+v: %v, want invalid", bad, err)
		}
	}
	a := e.create() // 1024 MiB each: three fill the 3072 MiB
	b := e.create()
	if _, err := e.svc.Fork(ctx, a, 2); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("fork past capacity: %v, want unavailable", err)
	}
	c := e.create()
	if _, err := e.svc.Create(ctx, CreateRequest{}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("create past capacity: %v, want unavailable", err)
	}
	// Pausing frees the room; resuming needs it back.
	if _, _, err := e.svc.Pause(ctx, c); err != nil {
		t.Fatal(err)
	}
	e.waitFor(c, StatusPaused)
	d := e.create()
	if _, _, err := e.svc.Resume(ctx, c); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("resume past capacity: %v, want unavailable", err)
	}
	// A fork of the paused sandbox whose children would resume is refused up front too (it answered 200, its
	// children left paused); with start_paused they need no room.
	if _, err := e.svc.Fork(ctx, c, 1); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("fork of a paused sandbox past capacity: %v, want unavailable", err)
	}
	kids, err := e.svc.ForkWithOptions(ctx, c, 1, ForkOptions{StartPaused: true})
	if err != nil {
		t.Fatalf("fork of a paused sandbox, start_paused, past capacity: %v", err)
	}
	if err := e.svc.Delete(ctx, kids.Children[0]); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.svc.Resume(ctx, c); err != nil {
		t.Fatalf("resume with room: %v", err)
	}
	e.waitFor(c, StatusRunning)
	if err := e.svc.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Fork(ctx, a, 1); err != nil {
		t.Fatalf("fork with room: %v", err)
	}
}
