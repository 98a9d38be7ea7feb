package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/store"
)

// waitBlocked waits until some goroutine whose stack passes through fn is parked in the wait state named
// state (as a goroutine dump shows it: "sync.RWMutex.Lock", "sync.RWMutex.RLock", ...). It is how a test
// sequences callers at a lock without sleeping.
func waitBlocked(t *testing.T, fn, state string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	buf := make([]byte, 1<<20)
	for time.Now().Before(deadline) {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if strings.Contains(g, "["+state) && strings.Contains(g, fn) {
				return
			}
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no goroutine in %s reached %s", fn, state)
}

// TestDiffAgainstMergeDoesNotDeadlock: diff(hi, lo) racing merge_into on the same pair. Diff used to take its
// read locks in argument order and merge its write locks in id order: with a caller holding lo shared, merge
// takes lo's lock (waiting for that reader), diff takes hi's read lock and queues behind merge on lo, and when
// the reader leaves, merge waits for hi (held by diff) while diff waits for lo (held by merge), for good.
func TestDiffAgainstMergeDoesNotDeadlock(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	p := e.create()
	fr, err := e.svc.Fork(ctx, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	c := fr.Children[0]
	lo, hi := p, c
	if hi < lo {
		lo, hi = hi, lo
	}
	// A run_code on lo holds it shared until the gate opens.
	held := make(chan struct{})
	e.rt.SetFault(func(ctx context.Context, method, id string) error {
		if method == "agent:run_code" && id == lo {
			close(held)
		}
		return nil
	})
	open := e.rt.Gate("hold")
	defer open()
	runDone := make(chan error, 1)
	go func() {
		_, err := e.svc.RunCode(ctx, lo, RunCodeRequest{Code: "wait hold"}, nil)
		runDone <- err
	}()
	<-held
	mergeDone := make(chan error, 1)
	go func() { mergeDone <- e.svc.MergeInto(ctx, p, c) }()
	waitBlocked(t, "(*Service).MergeInto(", "sync.RWMutex.Lock")
	diffDone := make(chan error, 1)
	go func() {
		_, err := e.svc.Diff(ctx, hi, lo, nil)
		diffDone <- err
	}()
	waitBlocked(t, "(*Service).Diff(", "sync.RWMutex.RLock")
	open()
	within(t, 10*time.Second, "run_code, merge_into and diff", func() {
		if err := <-runDone; err != nil {
			t.Errorf("run_code: %v", err)
		}
		if err := <-mergeDone; err != nil {
			t.Errorf("merge: %v", err)
		}
		if err := <-diffDone; err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("diff: %v", err)
		}
	})
}

// TestConcurrentCallers: callers hammer a handful of sandboxes with every operation at once (run_code, exec,
// files, fork, merge, diff, pause, resume, delete, create, wait). Every call must end (no deadlock), fail only
// with not found, conflict or invalid, and afterwards the API, the store, the runtime and the snapshot store
// must agree on every sandbox.
func TestConcurrentCallers(t *testing.T) {
	concurrentCallers(t, func(c *Config) { c.WarmPool = 1 }, false)
}

// TestConcurrentCallersWithChildrenMadeAhead is TestConcurrentCallers with children made ahead of forks, and
// callers that pause now and then long enough for sandboxes that forked to get some (ahead.go).
func TestConcurrentCallersWithChildrenMadeAhead(t *testing.T) {
	concurrentCallers(t, func(c *Config) { c.WarmPool, c.ForkAhead = 1, 4 }, true)
}

func concurrentCallers(t *testing.T, change func(*Config), idle bool) {
	e := newEnv(t, change)
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		e.create()
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	const workers, calls = 8, 40
	var wg sync.WaitGroup
	within(t, 60*time.Second, "the callers", func() {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(seed), uint64(w)))
				for i := 0; i < calls; i++ {
					if idle && r.IntN(4) == 0 {
						time.Sleep(aheadIdle + time.Duration(r.IntN(100))*time.Millisecond)
					}
					ids := e.ids()
					if len(ids) == 0 {
						ids = []string{NewID()}
					}
					a, b := ids[r.IntN(len(ids))], ids[r.IntN(len(ids))]
					var err error
					switch r.IntN(12) {
					case 0:
						_, err = e.svc.RunCode(ctx, a, RunCodeRequest{Code: fmt.Sprintf("v%d = %d", w, i)}, nil)
					case 1:
						_, err = e.svc.Exec(ctx, a, ExecRequest{Cmd: "true"}, nil)
					case 2:
						var fc *FileCall
						if fc, err = e.svc.Files(ctx, a); err == nil {
							fc.Release()
						}
					case 3:
						_, err = e.svc.ForkWith(ctx, a, 1+r.IntN(2), r.IntN(2) == 0)
					case 4:
						if a != b {
							err = e.svc.MergeInto(ctx, a, b)
						}
					case 5:
						_, err = e.svc.Diff(ctx, a, b, nil)
					case 6:
						_, _, err = e.svc.Pause(ctx, a)
					case 7:
						_, _, err = e.svc.Resume(ctx, a)
					case 8:
						if len(ids) > 3 {
							err = e.svc.Delete(ctx, a)
						}
					case 9:
						if len(ids) < 12 {
							_, err = e.svc.Create(ctx, CreateRequest{})
						}
					case 10:
						_, err = e.svc.Wait(ctx, a, StatusRunning, time.Millisecond)
					case 11:
						_, err = e.svc.Get(ctx, a)
					}
					if err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrConflict) && !errors.Is(err, errdefs.ErrInvalid) {
						t.Errorf("worker %d call %d: %v", w, i, err)
					}
				}
			}(w)
		}
		wg.Wait()
	})
	// Let pauses and resumes in flight finish, then check that everyone agrees.
	for _, in := range e.svc.List(ctx, ListOptions{}) {
		for _, want := range []Status{StatusPaused, StatusRunning} {
			if in.Status == StatusPausing && want == StatusPaused || in.Status == StatusResuming && want == StatusRunning {
				e.svc.Wait(ctx, in.ID, want, 20*time.Second) //nolint:errcheck
			}
		}
	}
	if idle {
		st := e.svc.Stats()
		t.Logf("children made ahead: %d made, %d used, %d dropped", st.AheadMade, st.AheadUsed, st.AheadDropped)
		if st.AheadMade == 0 {
			t.Errorf("no children were made ahead: the test did not exercise them")
		}
	}
	e.svc.Close() // stops the pool: what remains is what the API shows
	recs, err := e.store.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string]store.Record{}
	for _, r := range recs {
		recorded[r.ID] = r
	}
	listed := e.svc.List(ctx, ListOptions{})
	if len(listed) != len(recs) {
		t.Errorf("the API lists %d sandboxes, the store holds %d", len(listed), len(recs))
	}
	running := map[string]bool{}
	snapshotOwners := map[string]bool{}
	for _, in := range listed {
		r, ok := recorded[in.ID]
		if !ok || Status(r.Status) != in.Status {
			t.Errorf("%s: the API says %s, the store %q", in.ID, in.Status, r.Status)
		}
		switch in.Status {
		case StatusRunning:
			running[in.ID] = true
		case StatusPaused, StatusError:
			if r.Snapshot != "" {
				snapshotOwners[strings.SplitN(r.Snapshot, "/", 2)[0]] = true
			}
		default:
			t.Errorf("%s is still %s", in.ID, in.Status)
		}
	}
	for _, id := range e.rt.IDs() {
		if !running[id] {
			t.Errorf("the runtime holds %s, which is not running", id)
		}
	}
	for id := range running {
		if e.rt.Get(id) == nil {
			t.Errorf("%s is running but the runtime does not hold it", id)
		}
	}
	for _, k := range e.snaps.Keys() {
		if !snapshotOwners[strings.SplitN(k, "/", 2)[0]] {
			t.Errorf("snapshot object %s belongs to no paused sandbox", k)
		}
	}
}
