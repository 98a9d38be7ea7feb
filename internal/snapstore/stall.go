package snapstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// A transfer to or from S3 that makes no progress is abandoned rather than waited on forever: a service that
// stops answering (a stopped process, a dead link with the connection left open) would otherwise hold a pause
// in pausing, or a resume in resuming, with no end. Progress is bytes moving while the transfer waits on the
// network; a reader of a Get that is slow to take the bytes is not a stall.

// s3Stall is how long a transfer may wait on the S3 service without a byte moving before it is abandoned.
var s3Stall = 60 * time.Second

// errStalled is the cause of an abandoned transfer.
var errStalled = errors.New("the S3 service stopped answering")

// stallWatch cancels a transfer (through cancel) when, while at least one of its operations waits on the
// network, no progress has been made for s3Stall.
type stallWatch struct {
	last   atomic.Int64 // when progress was last made, in UnixNano
	busy   atomic.Int32 // operations waiting on the network now
	limit  atomic.Int64 // the stall limit now (tighten), a time.Duration
	cancel context.CancelCauseFunc
	stop   chan struct{}
}

func newStallWatch(cancel context.CancelCauseFunc) *stallWatch {
	w := &stallWatch{cancel: cancel, stop: make(chan struct{})}
	w.progress()
	w.limit.Store(int64(s3Stall))
	tick := min(s3Stall/8, 500*time.Millisecond)
	go func() {
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
				limit := time.Duration(w.limit.Load())
				if w.busy.Load() > 0 && time.Since(time.Unix(0, w.last.Load())) > limit {
					w.cancel(fmt.Errorf("%w: no byte moved for %v", errStalled, limit))
					return
				}
			}
		}
	}()
	return w
}

// tighten lowers the stall limit to d: the transfer has failed, and what is still in flight is only waited for
// while bytes move.
func (w *stallWatch) tighten(d time.Duration) {
	if d < time.Duration(w.limit.Load()) {
		w.limit.Store(int64(d))
	}
}

func (w *stallWatch) progress() { w.last.Store(time.Now().UnixNano()) }

// begin marks an operation waiting on the network until the returned end is called.
func (w *stallWatch) begin() (end func()) {
	if w.busy.Add(1) == 1 {
		w.progress() // the clock starts when something waits, not at the last progress before an idle spell
	}
	return func() { w.busy.Add(-1) }
}

func (w *stallWatch) Close() { close(w.stop) }

// stalled returns the watch's cause when ctx was cancelled by it, else err.
func stalled(ctx context.Context, err error) error {
	if c := context.Cause(ctx); errors.Is(c, errStalled) {
		return c
	}
	return err
}

// progressReader reports each read to its watch: the body of an upload, read as it is sent.
type progressReader struct {
	r io.Reader
	w *stallWatch
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.w.progress()
	}
	return n, err
}

// watchedBody is a Get's object: every read waits on the network under the watch, which cancels the request
// (ctx) when one stalls; Close ends both. A stream that ends before the object's size is an error, not its end.
type watchedBody struct {
	rc     io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	w      *stallWatch
	size   int64 // the object's, as its GET answered
	got    int64
}

func (b *watchedBody) Read(p []byte) (int, error) {
	end := b.w.begin()
	n, err := b.rc.Read(p)
	end()
	if n > 0 {
		b.w.progress()
		b.got += int64(n)
	}
	if err == io.EOF && b.got < b.size {
		err = fmt.Errorf("the transfer ended after %d of the object's %d bytes: %w", b.got, b.size, io.ErrUnexpectedEOF)
	}
	if err != nil && err != io.EOF {
		err = stalled(b.ctx, err)
	}
	return n, err
}

func (b *watchedBody) Close() error {
	b.w.Close()
	err := b.rc.Close()
	b.cancel(nil)
	return err
}
