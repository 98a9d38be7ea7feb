package agent

import (
	"bufio"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// A request that reached an agent which then died is not sent again unless it may be repeated: a run_code or a
// fork_repl must never run twice; a ping may.
func TestCallRetriesOnlyWhatMayRepeat(t *testing.T) {
	for _, c := range []struct {
		op      string
		retried bool
	}{{"ping", true}, {"run_code", false}, {"fork_repl", false}, {"exec", false}} {
		var dials atomic.Int32
		client := NewClient(func(ctx context.Context) (net.Conn, error) {
			n := dials.Add(1)
			mine, theirs := net.Pipe()
			go func() {
				defer theirs.Close()
				r := bufio.NewReader(theirs)
				if _, err := r.ReadString('\n'); err != nil {
					return
				}
				if n == 1 {
					return // the first agent dies having received the request
				}
				theirs.Write([]byte(`{"type":"ok"}` + "\n")) //nolint:errcheck
			}()
			return mine, nil
		})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := client.roundTrip(ctx, Request{Op: c.op}, nil)
		cancel()
		if retried := dials.Load() == 2; retried != c.retried || (err == nil) != c.retried {
			t.Errorf("%s: %d dials, err %v; want retried=%v", c.op, dials.Load(), err, c.retried)
		}
	}
}
