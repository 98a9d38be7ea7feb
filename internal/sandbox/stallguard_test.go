package sandbox

import (
	"errors"
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

// A stream of up to max bytes reads whole; one byte more ends it in tooLong, and every read after that too.
func TestStallGuardBoundsTheStream(t *testing.T) {
	tooLong := errors.New("too long")
	for _, c := range []struct {
		size, max int64
		want      error
	}{
		{size: 0, max: 10},
		{size: 10, max: 10},
		{size: 11, max: 10, want: tooLong},
		{size: 5 << 20, max: 5 << 20},
		{size: 5<<20 + 1, max: 5 << 20, want: tooLong},
		{size: 64 << 20, max: 5 << 20, want: tooLong},
		{size: 64 << 20, max: 0},
	} {
		g := &stallGuard{r: io.LimitReader(zeros{}, c.size), idle: time.Minute, stalled: func(bool) {}, max: c.max, tooLong: tooLong}
		n, err := io.Copy(io.Discard, g)
		if err != c.want {
			t.Errorf("%d bytes under a bound of %d: %v, want %v", c.size, c.max, err, c.want)
		}
		if c.want == nil && n != c.size {
			t.Errorf("%d bytes under a bound of %d: read %d", c.size, c.max, n)
		}
		if c.want != nil && n > c.max {
			t.Errorf("%d bytes under a bound of %d: %d passed on", c.size, c.max, n)
		}
		if c.want != nil {
			if _, err := g.Read(make([]byte, 1)); err != tooLong {
				t.Errorf("a read after the bound: %v", err)
			}
		}
	}
}

// zeros reads as an endless stream of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
