package snapstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/s3test"
)

// stallProxy forwards TCP connections to an S3 server and, once armed, stops forwarding in one direction after
// a number of bytes (every connection, new ones too) until released: a service that stops answering with its
// connections left open.
type stallProxy struct {
	addr    string
	up      atomic.Bool // stall what goes to the server (an upload), else what comes back (a download)
	after   atomic.Int64
	moved   atomic.Int64
	armed   atomic.Bool
	mu      sync.Mutex
	release chan struct{}
}

func newStallProxy(t *testing.T, upstream string) *stallProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{addr: ln.Addr().String(), release: make(chan struct{})}
	t.Cleanup(func() { ln.Close(); p.unstall() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			go p.pipe(u, c, true)
			go p.pipe(c, u, false)
		}
	}()
	return p
}

func (p *stallProxy) pipe(dst, src net.Conn, toServer bool) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.armed.Load() && toServer == p.up.Load() && p.moved.Add(int64(n)) > p.after.Load() {
				p.mu.Lock()
				rel := p.release
				p.mu.Unlock()
				<-rel
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// stall arms the proxy: after more bytes in the direction up says, nothing more passes until unstall.
func (p *stallProxy) stall(up bool, after int64) {
	p.mu.Lock()
	p.release = make(chan struct{})
	p.mu.Unlock()
	p.up.Store(up)
	p.moved.Store(0)
	p.after.Store(after)
	p.armed.Store(true)
}

func (p *stallProxy) unstall() {
	p.armed.Store(false)
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.release:
	default:
		close(p.release)
	}
}

// TestS3StallIsAbandoned: an S3 service that stops answering in the middle of a transfer fails the Put, and a
// Get's read, within the stall limit, with an error that says so, instead of holding a pause in pausing (or a
// resume in resuming) for ever; once the service answers again, the store works as before.
func TestS3StallIsAbandoned(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	oldStall, oldGrace := s3Stall, s3AbortGrace
	s3Stall, s3AbortGrace = time.Second, 2*time.Second
	defer func() { s3Stall, s3AbortGrace = oldStall, oldGrace }()
	proxy := newStallProxy(t, s3test.Endpoint(t))
	ctx := context.Background()
	s, err := NewS3(ctx, S3Config{Endpoint: proxy.addr, Region: "us-east-1", Bucket: fmt.Sprintf("ramify-stall-%s", randomName()[:8]),
		AccessKey: s3test.AccessKey, SecretKey: s3test.SecretKey})
	if err != nil {
		t.Fatal(err)
	}

	for _, size := range []int64{4 << 20, 200 << 20} { // one request; a multipart upload
		proxy.stall(true, 1<<20)
		start := time.Now()
		_, err := s.Put(ctx, "stalled", randReader(1, size))
		took := time.Since(start)
		proxy.unstall()
		if !errors.Is(err, errStalled) {
			t.Fatalf("put of %d MiB to a service that stopped answering: %v, want %v", size>>20, err, errStalled)
		}
		if took > 10*time.Second {
			t.Errorf("put of %d MiB gave up after %v (stall limit %v)", size>>20, took, s3Stall)
		}
	}

	want := randBytes(2, 64<<20)
	put(t, s, "object", want)
	proxy.stall(false, 8<<20)
	start := time.Now()
	rc, err := s.Get(ctx, "object")
	if err == nil {
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
	}
	took := time.Since(start)
	proxy.unstall()
	if !errors.Is(err, errStalled) || took > 10*time.Second {
		t.Fatalf("get from a service that stopped answering: %v after %v, want %v", err, took, errStalled)
	}
	// A slow reader is not a stall: the service keeps up, the reader takes its time.
	rc, err = s.Get(ctx, "object")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * s3Stall)
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || len(got) != len(want) {
		t.Fatalf("get read slowly: %d bytes, %v", len(got), err)
	}
	if o := put(t, s, "again", want); o.Size != int64(len(want)) {
		t.Fatalf("put after the service came back: %+v", o)
	}

	// A Put its caller cancels while the service has stopped answering (a delete of a sandbox whose pause is
	// stuck) returns within the short stall limit of a failed Put, not the long one, nor after waiting on the
	// abort.
	s3Stall, s3AbortStall = 30*time.Second, time.Second
	defer func() { s3AbortStall = 5 * time.Second }()
	proxy.stall(true, 20<<20)
	cctx, cancel := context.WithCancel(ctx)
	go func() { time.Sleep(500 * time.Millisecond); cancel() }()
	start = time.Now()
	_, err = s.Put(cctx, "cancelled", randReader(3, 200<<20))
	took = time.Since(start)
	proxy.unstall()
	if err == nil || took > 3*time.Second {
		t.Fatalf("a cancelled put to a service that stopped answering: %v after %v", err, took)
	}
}
