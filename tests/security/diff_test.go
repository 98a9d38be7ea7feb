package security

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// diffStep bounds one step of the diff attacks: a server that hangs on one fails the test instead of hanging it.
func diffStep(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// diffSh runs cmd in sandbox id and fails the test unless it exits 0.
func diffSh(t *testing.T, s *testserver.Server, id, cmd string) {
	t.Helper()
	res, err := s.Client.Exec(diffStep(t, 2*time.Minute), id, client.ExecRequest{Cmd: cmd})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q in %s: %+v, %v", cmd, id, res, err)
	}
}

// diffDelete deletes sandbox id when the test ends, whatever became of it (the server's own clean-up also would).
func diffDelete(t *testing.T, s *testserver.Server, id string) {
	t.Cleanup(func() { s.Client.Delete(diffStep(t, time.Minute), id) }) //nolint:errcheck // may be gone already
}

// diffShort describes d with at most 5 paths a list (a diff that went through a symlink to the host's /etc lists
// thousands).
func diffShort(d *client.Diff) string {
	short := func(l []string) string {
		if len(l) > 5 {
			return fmt.Sprintf("%q and %d more", l[:5], len(l)-5)
		}
		return fmt.Sprintf("%q", l)
	}
	return fmt.Sprintf("added %s, removed %s, modified %s, truncated %v", short(d.Added), short(d.Removed), short(d.Modified), d.Truncated)
}

// The server computes a diff on the host, as root, from the sandboxes' layers, which their code writes: symlinks
// planted there, in place of a directory the other sandbox has (/root/sub -> /etc), to the host's root, or
// climbing with `..`, are compared as symlinks and never followed. No host file is listed, and the other
// sandbox's /root/sub/passwd is removed, not compared with the host's /etc/passwd. Fork siblings (compared through
// their changes since the fork) and unrelated sandboxes (compared by walking their layers) alike.
func TestDiffDoesNotFollowSandboxSymlinks(t *testing.T) {
	s := testserver.Start(t)
	a := s.Create(t, nil)
	diffDelete(t, s, a)
	diffSh(t, s, a, "mkdir -p /root/sub && echo x > /root/sub/passwd")
	b := s.Fork(t, a, 1)[0]
	diffDelete(t, s, b)
	c := s.Create(t, nil)
	diffDelete(t, s, c)
	diffSh(t, s, c, "mkdir -p /root/sub && echo x > /root/sub/passwd")
	for _, id := range []string{b, c} {
		diffSh(t, s, id, "rm -r /root/sub && ln -s /etc /root/sub && ln -s / /root/all && ln -s / /hostroot && ln -s ../../../../../../../.. /rel")
	}
	paths := []string{"/root", "/tmp", "/hostroot/tmp", "/hostroot/etc", "/rel/etc"}
	for name, other := range map[string]string{"fork child": b, "unrelated sandbox": c} {
		d, err := s.Client.Diff(diffStep(t, time.Minute), a, other, paths)
		if err != nil {
			t.Fatalf("%s: diff: %v", name, err)
		}
		want := client.Diff{Added: []string{"/root/all", "/root/sub"}, Removed: []string{"/root/sub/passwd"}, Modified: []string{}}
		if !reflect.DeepEqual(*d, want) {
			t.Errorf("%s: the diff went through the sandbox's symlinks:\n got %s\nwant %+v", name, diffShort(d), want)
		}
		for _, p := range append(append(d.Added, d.Removed...), d.Modified...) {
			if strings.HasPrefix(p, "/hostroot/") || strings.HasPrefix(p, "/rel/") || strings.HasPrefix(p, "/root/all/") {
				t.Errorf("%s: a host file is listed: %s", name, p)
			}
		}
		r, err := s.Client.Diff(diffStep(t, time.Minute), other, a, paths)
		if err != nil {
			t.Fatalf("%s: diff the other way: %v", name, err)
		}
		if !reflect.DeepEqual(*r, client.Diff{Added: want.Removed, Removed: want.Added, Modified: []string{}}) {
			t.Errorf("%s: the diff the other way: %s", name, diffShort(r))
		}
	}
}

// A diff reads only the data of sparse files (holes compare equal unread), and a delete of either sandbox stops a
// diff in flight: the delete answers at once, the diff with 409.
func TestDiffOfHugeFilesIsBoundedAndStoppedByDelete(t *testing.T) {
	s := testserver.Start(t)
	a := s.Create(t, nil)
	diffDelete(t, s, a)
	// /root/data (2 GiB of data) is shared with the fork child, touched on both sides after the fork: their
	// content must be read to be compared (4 GiB, the server's bound).
	diffSh(t, s, a, "dd if=/dev/zero of=/root/data bs=1M count=2048 status=none")
	b := s.Fork(t, a, 1)[0]
	diffDelete(t, s, b)
	for _, id := range []string{a, b} {
		diffSh(t, s, id, "truncate -s 64G /root/big /root/big2 && touch /root/data")
	}
	// The same 64 GiB of holes but for one byte at 40 GiB in b.
	diffSh(t, s, b, "printf x | dd of=/root/big2 bs=1 seek=$((40<<30)) conv=notrunc status=none")

	t.Run("SparseFast", func(t *testing.T) {
		start := time.Now()
		d, err := s.Client.Diff(diffStep(t, time.Minute), a, b, []string{"/root/big", "/root/big2"})
		took := time.Since(start)
		t.Logf("diff of two pairs of 64 GiB sparse files: %v", took)
		if err != nil {
			t.Fatalf("diff after %v: %v", took, err)
		}
		if want := (client.Diff{Added: []string{}, Removed: []string{}, Modified: []string{"/root/big2"}}); !reflect.DeepEqual(*d, want) {
			t.Errorf("got %+v\nwant %+v", *d, want)
		}
		if took > 5*time.Second {
			t.Errorf("the diff of 64 GiB sparse files took %v", took)
		}
	})

	t.Run("DeleteStopsDiff", func(t *testing.T) {
		type result struct {
			d   *client.Diff
			err error
			at  time.Time
		}
		done := make(chan result, 1)
		start := time.Now()
		go func() {
			d, err := s.Client.Diff(diffStep(t, 5*time.Minute), a, b, []string{"/root"})
			done <- result{d, err, time.Now()}
		}()
		time.Sleep(300 * time.Millisecond) // the diff is reading /root/data (4 GiB: 1.4 s warm, 2.9 s cold here)
		delStart := time.Now()
		select {
		case r := <-done:
			t.Fatalf("the diff ended after %v, before the delete (%+v, %v): nothing left to stop", r.at.Sub(start), r.d, r.err)
		default:
		}
		err := s.Client.Delete(diffStep(t, 30*time.Second), b)
		took := time.Since(delStart)
		t.Logf("delete during the diff answered in %v", took)
		if err != nil {
			t.Fatalf("delete during a diff: %v after %v", err, took)
		}
		if took > 5*time.Second {
			t.Errorf("the delete waited %v for the diff", took)
		}
		select {
		case r := <-done:
			if !errors.Is(r.err, client.ErrConflict) || !strings.Contains(r.err.Error(), "was deleted while the call ran") {
				t.Errorf("the diff stopped by the delete answered %+v, %v", r.d, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the diff did not answer within 10 s of the delete")
		}
		if _, err := s.Client.Get(diffStep(t, 30*time.Second), b); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("the deleted sandbox: %v", err)
		}
	})
}
