package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A running sandbox whose machinery dies is restarted by the service (files kept, interpreter fresh) or, when
// that fails, marked error with the reason: never left "running" and unable to answer.
func TestLostSandboxIsRevivedOrMarkedError(t *testing.T) {
	e := newEnv(t, nil)
	revived, broken := e.create(), e.create()
	for _, id := range []string{revived, broken} {
		e.run(id, "x = 1")
	}
	if err := os.WriteFile(filepath.Join(e.rt.UpperDir(e.rt.Get(revived).Handle()), "kept.txt"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.rt.SetFault(func(ctx context.Context, method, id string) error {
		if method == "Revive" && id == broken {
			return errors.New("its layer is gone")
		}
		return nil
	})
	e.rt.Kill(revived)
	e.rt.Kill(broken)
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, err := e.svc.Get(context.Background(), broken)
		if err == nil && in.Status == StatusError {
			if !strings.Contains(in.Error, "its layer is gone") || !strings.Contains(in.Error, "died") {
				t.Errorf("error does not say what happened: %q", in.Error)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the unrevivable sandbox is still %s", in.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stillLost := func() bool {
		for _, l := range e.rt.Lost() {
			if l.Handle.ID == revived {
				return true
			}
		}
		return false
	}
	for stillLost() {
		if time.Now().After(deadline) {
			t.Fatal("the lost sandbox was not revived")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := e.status(revived); got != StatusRunning {
		t.Fatalf("revived sandbox is %s", got)
	}
	ex, err := e.svc.RunCode(context.Background(), revived, RunCodeRequest{Code: "x"}, nil)
	if err != nil || ex.Error == nil {
		t.Errorf("a revived sandbox runs a fresh interpreter: %+v %v", ex, err)
	}
	if b, err := os.ReadFile(filepath.Join(e.rt.UpperDir(e.rt.Get(revived).Handle()), "kept.txt")); err != nil || string(b) != "kept" {
		t.Errorf("files after the revival: %q %v", b, err)
	}
}
