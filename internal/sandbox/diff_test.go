package sandbox

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// writeData writes mib MiB of data (no holes) to rel in sandbox id's upper layer.
func (e *env) writeData(id, rel string, mib int) {
	e.t.Helper()
	p := filepath.Join(e.rt.UpperDir(e.rt.Get(id).Handle()), rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	f, err := os.Create(p)
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	for range mib {
		if _, err := f.Write(chunk); err != nil {
			e.t.Fatal(err)
		}
	}
}

// A delete of either sandbox stops a diff in flight (comparing two large files here) rather than waiting for it:
// the delete goes through at once and the diff answers that the sandbox was deleted.
func TestDeleteStopsADiff(t *testing.T) {
	for _, which := range []string{"a", "b"} {
		t.Run("delete "+which, func(t *testing.T) {
			e := newEnv(t, nil)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			a := e.create()
			fr, err := e.svc.Fork(ctx, a, 1)
			if err != nil {
				t.Fatal(err)
			}
			b := fr.Children[0]
			for _, id := range []string{a, b} {
				e.writeData(id, "root/data", 512)
			}
			diffDone := make(chan error, 1)
			go func() {
				_, err := e.svc.Diff(ctx, a, b, nil)
				diffDone <- err
			}()
			waitBlocked(t, "fsdiff.sameContent(", "")
			victim := map[string]string{"a": a, "b": b}[which]
			start := time.Now()
			if err := e.svc.Delete(ctx, victim); err != nil {
				t.Fatalf("delete during a diff: %v", err)
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("the delete waited %v for the diff", took)
			}
			err = <-diffDone
			if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), victim+" was deleted while the call ran") {
				t.Errorf("the diff stopped by the delete of %s: %v", victim, err)
			}
		})
	}
}
