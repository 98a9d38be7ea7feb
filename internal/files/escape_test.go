package files

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// outsideFixture creates <base>/outside with a sentinel file and returns its path and a check that it is
// untouched.
func outsideFixture(t testing.TB, base string) (string, func()) {
	t.Helper()
	out := filepath.Join(base, "outside")
	mustWrite(t, filepath.Join(out, "secret"), "host secret", 0o600)
	mustWrite(t, filepath.Join(out, "sub/deep"), "deep", 0o600)
	return out, func() {
		t.Helper()
		var got []string
		filepath.Walk(out, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				t.Errorf("walk outside: %v", err)
				return nil
			}
			r, _ := filepath.Rel(out, p)
			got = append(got, r)
			return nil
		})
		sort.Strings(got)
		if strings.Join(got, ",") != ".,secret,sub,sub/deep" {
			t.Errorf("outside dir changed: %v", got)
		}
		if b, err := os.ReadFile(filepath.Join(out, "secret")); err != nil || string(b) != "host secret" {
			t.Errorf("outside secret changed: %q %v", b, err)
		}
		if fi, err := os.Stat(filepath.Join(out, "secret")); err == nil {
			if u, _ := owner(t, filepath.Join(out, "secret")); u != 0 || fi.Mode().Perm() != 0o600 {
				t.Errorf("outside secret owner/mode changed: %d %v", u, fi.Mode())
			}
		}
		ents, _ := os.ReadDir(base)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if strings.Join(names, ",") != "outside,root" {
			t.Errorf("base dir has %v", names)
		}
	}
}

func TestEscapes(t *testing.T) {
	f, root, base := newFS(t)
	out, check := outsideFixture(t, base)
	defer check()
	mustWrite(t, filepath.Join(root, "etc/passwd"), "sandbox passwd", 0o644)

	// `..` beyond the root in the request path is clamped (CleanPath) ...
	if s := readAll(t, f, "/../../etc/passwd"); s != "sandbox passwd" {
		t.Fatalf("../../etc/passwd read %q", s)
	}
	// ... and in symlinks by the kernel.
	os.Symlink("/etc", filepath.Join(root, "abs"))
	if s := readAll(t, f, "/abs/passwd"); s != "sandbox passwd" {
		t.Fatalf("absolute symlink read %q", s)
	}
	os.MkdirAll(filepath.Join(root, "a/b"), 0o755)
	os.Symlink("../../../../../../../../etc/passwd", filepath.Join(root, "a/b/rel"))
	if s := readAll(t, f, "/a/b/rel"); s != "sandbox passwd" {
		t.Fatalf("relative .. symlink read %q", s)
	}
	os.Symlink("../../..", filepath.Join(root, "a/b/up"))
	if s := readAll(t, f, "/a/b/up/etc/passwd"); s != "sandbox passwd" {
		t.Fatalf("relative .. dir symlink read %q", s)
	}
	// Symlinks as parent directories pointing outside, by absolute host path and relatively.
	os.Symlink(out, filepath.Join(root, "outabs"))
	os.Symlink("../outside", filepath.Join(root, "outrel"))
	for _, p := range []string{"/outabs/secret", "/outrel/secret", "/a/b/up/../outside/secret"} {
		if _, _, err := f.OpenRead(p); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("read %s: %v", p, err)
		}
	}
	// A symlink to a directory that does not exist inside the root: nothing is created through it.
	if _, err := f.Write("/outabs/new", strings.NewReader("pwned"), 0o777); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("write through a dangling symlink: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(root, out), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(root, "outside"), 0o755)
	for _, p := range []string{"/outabs/new", "/outrel/new", "/outabs/sub/deep", "/outrel/secret"} {
		if _, err := f.Write(p, strings.NewReader("pwned"), 0o777); err != nil {
			t.Fatalf("write %s: %v", p, err)
		}
	}
	// They were clamped: written inside the root.
	if b, err := os.ReadFile(filepath.Join(root, out, "new")); err != nil || string(b) != "pwned" {
		t.Fatalf("clamped absolute write: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "outside/secret")); err != nil || string(b) != "pwned" {
		t.Fatalf("clamped relative write: %q %v", b, err)
	}
	if _, err := f.Mkdir("/outrel/made/dirs", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "outside/made/dirs")); err != nil {
		t.Fatal(err)
	}

	// Write through a symlink final component pointing outside replaces the link, not the host file.
	os.Symlink(filepath.Join(out, "secret"), filepath.Join(root, "tosecret"))
	os.Symlink("../outside/secret", filepath.Join(root, "tosecret2"))
	for _, p := range []string{"/tosecret", "/tosecret2"} {
		if _, err := f.Write(p, strings.NewReader("overwritten"), 0); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("%s after write: %v %v", p, fi, err)
		}
	}

	// Remove of a symlink to outside removes only the link.
	os.Symlink(out, filepath.Join(root, "rmlink"))
	if err := f.Remove("/rmlink", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(root, "rmlink")); !os.IsNotExist(err) {
		t.Fatalf("link still there: %v", err)
	}
	// Remove through a symlinked parent is clamped too.
	if err := f.Remove("/outabs/secret", false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("remove through link: %v", err)
	}
	if err := f.Remove("/outrel/sub", true); err != nil { // root/outside/sub: does not exist
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatal(err)
		}
	}

	// Recursive Remove of a directory containing symlinks to the outside dir leaves it intact.
	os.MkdirAll(filepath.Join(root, "tree/x/y"), 0o755)
	os.Symlink(out, filepath.Join(root, "tree/abs"))
	os.Symlink("../../outside", filepath.Join(root, "tree/rel"))
	os.Symlink("../../../../outside", filepath.Join(root, "tree/x/y/rel"))
	os.Symlink(filepath.Join(out, "secret"), filepath.Join(root, "tree/x/file"))
	if err := f.Remove("/tree", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(root, "tree")); !os.IsNotExist(err) {
		t.Fatalf("tree still there: %v", err)
	}

	// Stat and List never leave the root either.
	if _, err := f.Stat("/outabs/secret"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat through link: %v", err)
	}
	ents, err := f.List("/outrel")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name == "sub" {
			t.Fatalf("listed the host's outside dir: %v", ents)
		}
	}
}

func TestSymlinkLoop(t *testing.T) {
	f, root, _ := newFS(t)
	os.Symlink("b", filepath.Join(root, "a"))
	os.Symlink("a", filepath.Join(root, "b"))
	os.Symlink("self", filepath.Join(root, "self"))
	os.Symlink("/loopdir/x", filepath.Join(root, "loopdir"))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, p := range []string{"/a", "/self", "/self/x", "/loopdir/y"} {
			_, _, err := f.OpenRead(p)
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "too many levels of symbolic links") {
				t.Errorf("read %s: %v", p, err)
			}
		}
		if _, err := f.Write("/a/x", strings.NewReader("x"), 0); err == nil {
			t.Errorf("write through a loop succeeded")
		}
		if _, err := f.Mkdir("/self/x", true); err == nil {
			t.Errorf("mkdir through a loop succeeded")
		}
		if _, err := f.List("/a"); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("list loop: %v", err)
		}
		// The loop itself can be inspected, replaced and removed.
		if e, err := f.Stat("/a"); err != nil || e.Type != "symlink" {
			t.Errorf("stat loop: %v %v", e, err)
		}
		if err := f.Remove("/self", false); err != nil {
			t.Errorf("remove loop: %v", err)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("symlink loop hangs")
	}
}

// TestMagicLinksAndPseudoFS mounts a procfs inside the root (in a private mount namespace of a locked thread)
// and checks that proc magic links are refused and proc files are not read.
func TestMagicLinksAndPseudoFS(t *testing.T) {
	_, root, base := newFS(t)
	_, check := outsideFixture(t, base)
	defer check()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine, and its namespace with it
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			t.Logf("unshare: %v", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
			t.Errorf("make private: %v", err)
			return
		}
		os.Mkdir(filepath.Join(root, "proc"), 0o555)
		if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", 0, ""); err != nil {
			t.Logf("mount proc: %v", err)
			return
		}
		// Opened in this mount namespace, where the proc mount is.
		f, err := Open(root, testUID, testGID)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		for _, p := range []string{"/proc/self/root/etc/hostname", "/proc/1/root/etc/hostname", "/proc/self/cwd"} {
			if _, _, err := f.OpenRead(p); err == nil || (strings.Contains(p, "self") && !errors.Is(err, errdefs.ErrInvalid)) {
				t.Errorf("read %s: %v", p, err)
			}
			if _, err := f.Write(p+"/x", strings.NewReader("x"), 0); err == nil {
				t.Errorf("write under %s succeeded", p)
			}
		}
		for _, p := range []string{"/proc/version", "/proc/kcore", "/proc/self/environ"} {
			if _, _, err := f.OpenRead(p); err == nil {
				t.Errorf("read %s succeeded", p)
			}
		}
		// The proc mount is skipped by WriteTar and refused by a recursive Remove.
		mustWrite(t, filepath.Join(root, "file"), "x", 0o644)
		var n countWriter
		if err := f.WriteTar("/", &n); err != nil {
			t.Errorf("tar: %v", err)
		}
		if n > 1<<20 {
			t.Errorf("tar of / with a proc mount is %d bytes", n)
		}
		if err := f.Remove("/proc", true); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("remove /proc: %v", err)
		}
		os.MkdirAll(filepath.Join(root, "x/p"), 0o755)
		if err := unix.Mount("proc", filepath.Join(root, "x/p"), "proc", 0, ""); err != nil {
			t.Errorf("mount proc: %v", err)
			return
		}
		if err := f.Remove("/x", true); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "pseudo") {
			t.Errorf("remove /x: %v", err)
		}
		unix.Unmount(filepath.Join(root, "x/p"), unix.MNT_DETACH)
		unix.Unmount(filepath.Join(root, "proc"), unix.MNT_DETACH)
	}()
	<-done
}

type countWriter int64

func (c *countWriter) Write(b []byte) (int, error) { *c += countWriter(len(b)); return len(b), nil }

// TestConcurrentSwap swaps a path component between a real directory and symlinks to the outside while
// writes, reads and removals go through it.
func TestConcurrentSwap(t *testing.T) {
	f, root, base := newFS(t)
	out, check := outsideFixture(t, base)
	defer check()
	os.Mkdir(filepath.Join(root, "real"), 0o755)
	os.Symlink(out, filepath.Join(root, "evil-abs"))
	os.Symlink("../outside", filepath.Join(root, "evil-rel"))
	os.MkdirAll(filepath.Join(root, "d1/d2"), 0o755)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sw := filepath.Join(root, "sw")
		for i := 0; !stop.Load(); i++ {
			switch i % 3 {
			case 0:
				os.Rename(filepath.Join(root, "real"), sw)
				os.Rename(sw, filepath.Join(root, "real"))
			case 1:
				os.Rename(filepath.Join(root, "evil-abs"), sw)
				os.Rename(sw, filepath.Join(root, "evil-abs"))
			case 2:
				os.Rename(filepath.Join(root, "evil-rel"), sw)
				os.Rename(sw, filepath.Join(root, "evil-rel"))
			}
			// Renames across directories make RESOLVE_IN_ROOT `..` lookups retry (EAGAIN).
			os.Rename(filepath.Join(root, "d1/d2"), filepath.Join(root, "d2"))
			os.Rename(filepath.Join(root, "d2"), filepath.Join(root, "d1/d2"))
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		f.Write("/sw/secret", strings.NewReader("pwned"), 0o777)
		f.Write("/sw/sub/deep", strings.NewReader("pwned"), 0o777)
		f.Mkdir("/sw/newdir", true)
		f.Remove("/sw/sub", true)
		if r, _, err := f.OpenRead("/sw/secret"); err == nil {
			r.Close()
		}
		f.Stat("/d1/d2/../../sw/secret")
	}
	stop.Store(true)
	wg.Wait()
}
