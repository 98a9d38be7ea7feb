package sandbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/pprof"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/runtime/fake"
	"github.com/ramify-dev/ramify/internal/store"
)

// The service's unit tests run the real service on a fake runtime (internal/runtime/fake: in-memory
// interpreters, temporary directories as layers, a real agent client over socketpairs), an in-memory snapshot
// store and a real SQLite store in a temporary directory: no root, no namespaces, seconds under -race.

// testIPs hands out 10.99.x.y addresses.
type testIPs struct{}

func (testIPs) Allocate(inUse func(net.IP) bool) (net.IP, error) {
	for i := 2; i < 65000; i++ {
		ip := net.IPv4(10, 99, byte(i>>8), byte(i))
		if !inUse(ip) {
			return ip, nil
		}
	}
	return nil, fmt.Errorf("no address left")
}

// env is one service under test and what it runs on.
type env struct {
	t     *testing.T
	svc   *Service
	rt    *fake.Runtime
	snaps *fake.Snapshots
	store *store.Store
	cfg   Config
}

// newEnv starts a service; change, if set, edits its config first.
func newEnv(t *testing.T, change func(*Config)) *env {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, rt: fake.New(t.TempDir()), snaps: fake.NewSnapshots(), store: st}
	e.cfg = Config{Store: st, Runtime: e.rt, IPs: testIPs{}, Snapshots: e.snaps,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), HostUID: -1, HostGID: -1}
	if change != nil {
		change(&e.cfg)
	}
	e.start()
	return e
}

// start (re)starts the service on the same store and runtime, as a server restart does.
func (e *env) start() {
	e.t.Helper()
	svc, err := New(context.Background(), e.cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.svc = svc
	e.t.Cleanup(svc.Close)
}

func (e *env) create() string {
	e.t.Helper()
	in, err := e.svc.Create(context.Background(), CreateRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	return in.ID
}

// run runs code and returns its value ("" when none), failing the test on an error or exception.
func (e *env) run(id, code string) string {
	e.t.Helper()
	ex, err := e.svc.RunCode(context.Background(), id, RunCodeRequest{Code: code}, nil)
	if err != nil {
		e.t.Fatalf("run_code %q in %s: %v", code, id, err)
	}
	if ex.Error != nil {
		e.t.Fatalf("run_code %q in %s raised %s: %s", code, id, ex.Error.Name, ex.Error.Value)
	}
	if ex.Value == nil {
		return ""
	}
	return *ex.Value
}

func (e *env) status(id string) Status {
	e.t.Helper()
	in, err := e.svc.Get(context.Background(), id)
	if err != nil {
		e.t.Fatalf("get %s: %v", id, err)
	}
	return in.Status
}

// waitFor waits (notified, bounded) until id has status want.
func (e *env) waitFor(id string, want Status) Info {
	e.t.Helper()
	in, err := e.svc.Wait(context.Background(), id, want, 20*time.Second)
	if err != nil {
		e.t.Fatalf("wait for %s to be %s: %v", id, want, err)
	}
	if in.Status != want {
		e.t.Fatalf("%s is %s (%s), want %s", id, in.Status, in.Error, want)
	}
	return in
}

// ids lists the sandboxes the API shows, sorted.
func (e *env) ids() []string {
	var out []string
	for _, in := range e.svc.List(context.Background(), ListOptions{}) {
		out = append(out, in.ID)
	}
	sort.Strings(out)
	return out
}

// within runs f and fails the test if it has not returned after d (a deadlock): the test then fails instead of
// hanging.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(d):
		var stacks strings.Builder
		pprof.Lookup("goroutine").WriteTo(&stacks, 1) //nolint:errcheck // for the report only
		t.Fatalf("%s did not return within %s: deadlock; goroutines:\n%s", what, d, stacks.String())
	}
}
