package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// A client that goes away stops its work: an abandoned run_code is interrupted (the interpreter and its state
// live on, free for the next call) and an abandoned exec's processes are killed.
func TestAbandonedCallsStop(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	value(t, s, id, "x = 'kept'")

	ctx, cancel := context.WithTimeout(context.Background(), 1*time.Second)
	_, err := s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: "import time; time.sleep(120)"})
	cancel()
	if err == nil {
		t.Fatal("the abandoned run_code returned without error")
	}
	start := time.Now()
	if v := value(t, s, id, "x"); v != "'kept'" {
		t.Errorf("the interpreter after an abandoned run_code: %s", v)
	}
	if waited := time.Since(start); waited > 30*time.Second {
		t.Errorf("the next run_code waited %v behind the abandoned one", waited)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 1*time.Second)
	_, err = s.Client.Exec(ctx, id, client.ExecRequest{Cmd: "sleep 120; echo late"})
	cancel()
	if err == nil {
		t.Fatal("the abandoned exec returned without error")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out := strings.TrimSpace(sh(t, s, id, "pgrep -c -x sleep || true").Stdout)
		if out == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the abandoned exec's sleep still runs (%s)", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
