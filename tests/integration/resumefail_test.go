package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/s3test"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// storeLink is a TCP proxy on loopback in front of the S3 store: cut, it drops its connections and refuses new
// ones, as a store that went away does.
type storeLink struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	up     bool
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

func newStoreLink(t *testing.T, target string) *storeLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &storeLink{ln: ln, target: target, up: true, conns: map[net.Conn]bool{}}
	l.wg.Add(1)
	go l.serve()
	t.Cleanup(func() {
		ln.Close()
		l.set(false)
		l.wg.Wait()
	})
	return l
}

func (l *storeLink) addr() string { return l.ln.Addr().String() }

func (l *storeLink) serve() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		if !l.up {
			l.mu.Unlock()
			c.Close() // refused: the store is not there
			continue
		}
		b, err := net.DialTimeout("tcp", l.target, 5*time.Second)
		if err != nil {
			l.mu.Unlock()
			c.Close()
			continue
		}
		l.conns[c], l.conns[b] = true, true
		l.wg.Add(2)
		l.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			defer l.wg.Done()
			io.Copy(dst, src) //nolint:errcheck // ends when either side closes
			dst.Close()
			src.Close()
		}
		go pipe(b, c)
		go pipe(c, b)
	}
}

// set brings the link up or cuts it (dropping the connections it carries).
func (l *storeLink) set(up bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.up = up
	if !up {
		for c := range l.conns {
			c.Close()
		}
		l.conns = map[net.Conn]bool{}
	}
}

// TestResumeKeepsPausedWhenStoreFails: a resume that fails because the snapshot store does not answer (a
// transient failure: nothing is wrong with the snapshot) leaves the sandbox paused with its snapshot, the
// failure in pause.error; the client's wait for running ends on it with a *client.ResumeError rather than a
// status error. Once the store is back, the resume brings the sandbox back with its interpreter's state and
// its files.
func TestResumeKeepsPausedWhenStoreFails(t *testing.T) {
	link := newStoreLink(t, s3test.Endpoint(t))
	bucket := fmt.Sprintf("ramify-rf-%d", os.Getpid())
	s := testserver.Start(t, "--s3-endpoint", link.addr(), "--s3-bucket", bucket, "--s3-prefix", "snaps/",
		"--s3-access-key", s3test.AccessKey, "--s3-secret-key", s3test.SecretKey)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	id := create(t, s, nil)
	value(t, s, id, "import hashlib, os; x = 41; blob = os.urandom(4 << 20); 1")
	sh(t, s, id, "head -c 2000000 /dev/urandom > /root/blob")
	want := value(t, s, id, "(x, hashlib.sha256(blob).hexdigest())")
	sum := sh(t, s, id, "sha256sum /root/blob").Stdout
	pauseAndWait(t, s, id)

	link.set(false)
	if _, _, err := s.Client.Resume(ctx, id); err != nil {
		t.Fatalf("resume: %v", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	sb, err := s.Client.WaitStatus(wctx, id, "running")
	wcancel()
	var re *client.ResumeError
	if !errors.As(err, &re) || sb.Status != "paused" || sb.Error != "" {
		t.Fatalf("resume while the store does not answer: %+v %v; want a *client.ResumeError, the sandbox paused", sb, err)
	}
	t.Logf("pause.error: %s", sb.Pause.Error)
	if !strings.HasPrefix(sb.Pause.Error, "resume failed: ") {
		t.Errorf("pause.error %q, want it to say the resume failed", sb.Pause.Error)
	}
	if got, err := s.Client.Get(ctx, id); err != nil || got.Status != "paused" {
		t.Fatalf("GET after the failed resume: %+v %v", got, err)
	}
	if _, err := s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: "x"}); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("run_code on the paused sandbox: %v, want a conflict", err)
	}
	// Its server restarted meanwhile, it is paused still.
	link.set(true)
	s.Restart()
	if got, err := s.Client.Get(ctx, id); err != nil || got.Status != "paused" {
		t.Fatalf("after a restart: %+v %v", got, err)
	}
	resumeAndWait(t, s, id)
	if got := value(t, s, id, "(x, hashlib.sha256(blob).hexdigest())"); got != want {
		t.Fatalf("session after the retried resume: %s, want %s", got, want)
	}
	if r := sh(t, s, id, "sha256sum /root/blob"); r.Stdout != sum {
		t.Fatalf("file after the retried resume: %q, want %q", r.Stdout, sum)
	}
	if got, _ := s.Client.Get(ctx, id); got.Pause == nil || got.Pause.Error != "" {
		t.Errorf("after the resume: pause %+v, want pause.error cleared", got.Pause)
	}
}
