package sandbox

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
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
	waitBlocked(t, "MergeInto", "sync.RWMutex.Lock")
	diffDone := make(chan error, 1)
	go func() {
		_, err := e.svc.Diff(ctx, hi, lo, nil)
		diffDone <- err
	}()
	waitBlocked(t, "Diff", "sync.RWMutex.RLock")
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
