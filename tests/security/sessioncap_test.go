package security

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// TestEndlessSessionDoesNotFillTheStore: code in the sandbox makes its own pause write without end into the
// snapshot store (an object whose __reduce__, run in the save copy, writes into the session's pipe itself). The
// stream is cut past four times mem_mib (1 GiB for this 256 MiB sandbox): the pause fails saying why, nothing of
// it is left in the store, and the sandbox runs on as it was. The attack stops at 1.25 GiB, so that a server
// without the bound stores that and fails the test, rather than filling the disk.
func TestEndlessSessionDoesNotFillTheStore(t *testing.T) {
	s := testserver.Start(t)
	ctx, cancel := context.WithTimeout(testserver.Ctx(t), 2*time.Minute)
	defer cancel()
	id := s.Create(t, &client.CreateRequest{MemMiB: 256})
	// The attacker finds the session's pipe in its caller's frame (the save's own code) and writes into it.
	if v := s.Value(t, id, `import os, sys
class Flood:
    def __reduce__(self):
        f = sys._getframe()
        while f is not None and f.f_code.co_name != "_save_session":
            f = f.f_back
        fd, sent = (f.f_locals.get("fd") if f is not None else None), 0
        chunk = b"\0" * (1 << 20)
        try:
            while fd is not None and sent < 1280 << 20:
                sent += os.write(fd, chunk)
        except OSError:
            pass
        return (str, ("fd %r, %d MiB" % (fd, sent >> 20),))
flood = Flood()
x = 41
x`); v != "41" {
		t.Fatalf("setup: %s", v)
	}
	if _, _, err := s.Client.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	got, err := s.Client.WaitStatus(ctx, id, client.StatusPaused)
	if got == nil || got.Status != client.StatusRunning || got.Pause == nil {
		t.Fatalf("a pause whose session writes 1.25 GiB for a 256 MiB sandbox: %+v, %v; want it failed, the sandbox running", got, err)
	}
	if !strings.Contains(got.Pause.Error, "passed 1024 MiB, four times mem_mib") {
		t.Errorf("the pause's error: %q", got.Pause.Error)
	}
	inv := s.Inventory()
	if len(inv.Snapshots) != 0 || len(inv.SnapshotTemps) != 0 {
		t.Errorf("left in the snapshot store: %v, temporary files %v", inv.Snapshots, inv.SnapshotTemps)
	}
	if v := s.Value(t, id, "x + 1, type(flood).__name__"); v != "(42, 'Flood')" {
		t.Errorf("the sandbox after the failed pause: %s", v)
	}
}
