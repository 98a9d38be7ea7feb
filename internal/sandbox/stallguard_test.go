package sandbox

import (
	"io"
	"sync/atomic"
	"testing"
	"time"
)

// slowReader gives n bytes per read, waiting every between reads, for ever.
type slowReader struct {
	n     int
	every time.Duration
}

func (r *slowReader) Read(p []byte) (int, error) {
	time.Sleep(r.every)
	return min(r.n, len(p)), nil
}

// A stream that keeps coming but trickles (a byte now and then, each within the idle wait) is stopped once it has
// run for idle, for averaging less than minRate; one that averages more is not; silence is still silence.
func TestStallGuardStopsATrickle(t *testing.T) {
	run := func(r io.Reader, reads int) (slow, silent int32) {
		var s, q atomic.Int32
		g := &stallGuard{r: r, idle: 50 * time.Millisecond, minRate: 1 << 20, stalled: func(isSlow bool) {
			if isSlow {
				s.Add(1)
			} else {
				q.Add(1)
			}
		}}
		buf := make([]byte, 1<<20)
		for range reads {
			g.Read(buf) //nolint:errcheck // never fails here
		}
		time.Sleep(10 * time.Millisecond)
		return s.Load(), q.Load()
	}
	if slow, silent := run(&slowReader{n: 10, every: 10 * time.Millisecond}, 12); slow != 1 || silent != 0 {
		t.Errorf("a trickle of 10 bytes every 10 ms: slow %d, silent %d; want it stopped once as slow", slow, silent)
	}
	if slow, silent := run(&slowReader{n: 1 << 20, every: 10 * time.Millisecond}, 12); slow != 0 || silent != 0 {
		t.Errorf("1 MiB every 10 ms: slow %d, silent %d; want it left alone", slow, silent)
	}
	if slow, silent := run(&slowReader{n: 1 << 20, every: 80 * time.Millisecond}, 2); silent == 0 {
		t.Errorf("80 ms of silence under a 50 ms idle wait: slow %d, silent %d; want it stopped as silent", slow, silent)
	}
}
