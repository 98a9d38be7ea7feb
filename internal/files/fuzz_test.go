package files

import (
	"errors"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/", "", "a", "/a/../..", "//a//b/", "/./.", "/a\x00", "/" + strings.Repeat("x/", 2100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := CleanPath(s)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("CleanPath(%q): error %v does not match ErrInvalid", s, err)
			}
			if s != "" && s[0] == '/' && len(s) <= MaxPathLen && !strings.Contains(s, "\x00") {
				t.Fatalf("CleanPath(%q) refused a valid path: %v", s, err)
			}
			return
		}
		if c == "" || c[0] != '/' || strings.Contains(c, "\x00") || len(c) > len(s) || len(c) > MaxPathLen {
			t.Fatalf("CleanPath(%q) = %q", s, c)
		}
		if path.Clean(c) != c {
			t.Fatalf("CleanPath(%q) = %q is not clean", s, c)
		}
		for _, comp := range strings.Split(c, "/") {
			if comp == ".." || comp == "." {
				t.Fatalf("CleanPath(%q) = %q has %q", s, c, comp)
			}
		}
		if c2, err := CleanPath(c); err != nil || c2 != c {
			t.Fatalf("CleanPath not idempotent on %q: %q %v", c, c2, err)
		}
	})
}

// realPath returns the host path of an open fd.
func realPath(t *testing.T, fd int) string {
	t.Helper()
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func assertInside(t *testing.T, root, real, what string) {
	t.Helper()
	r, err := filepath.Rel(root, real)
	if err != nil || r == ".." || strings.HasPrefix(r, "../") {
		t.Fatalf("%s resolved to %s, outside the root %s", what, real, root)
	}
}

func FuzzResolveInRoot(f *testing.F) {
	for _, s := range []string{
		"../../etc/passwd", "abs/secret", "rel/x", "up/outside/secret", "slash/..//abs/./x", "loop/x",
		"d/back/rel/sub/deep", "hostetc/passwd", "file/x", "dangling/y", "d/e/../../abs", "d/back/../../../outside",
		"d/e/up/rel/new", "abs", "rel", "d/upd/outside/sub",
	} {
		f.Add(s, uint8(0))
	}
	f.Fuzz(func(t *testing.T, s string, op uint8) {
		requireRoot(t)
		p, err := CleanPath("/" + s)
		if err != nil {
			return
		}
		base := t.TempDir()
		root := filepath.Join(base, "root")
		out, check := outsideFixture(t, base)
		os.MkdirAll(filepath.Join(root, "d/e"), 0o755)
		mustWrite(t, filepath.Join(root, "file"), "f", 0o644)
		for link, target := range map[string]string{
			"abs":      out,
			"rel":      "../outside",
			"up":       "../../../../..",
			"slash":    "/",
			"loop":     "loop",
			"d/back":   "../..",
			"d/upd":    "../../../..",
			"d/e/up":   "../../../../../../",
			"hostetc":  "/etc",
			"dangling": "/nonexistent/x",
		} {
			if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
				t.Fatal(err)
			}
		}
		fsys, err := Open(root, testUID, testGID)
		if err != nil {
			t.Fatal(err)
		}
		defer fsys.Close()
		rootfd, _ := fsys.acquire()
		defer fsys.release()

		switch op % 4 {
		case 0:
			// Where the write lands is resolved before it when its parent exists: the write may replace the very
			// link its own path goes through (/d/e/up/d/e/up writes /d/e/up, over the link to the root), after which
			// the path no longer resolves as it did. A missing parent is made by the write: resolved after it.
			dirfd, name, perr := openParent(rootfd, p)
			if _, err := fsys.Write(p, strings.NewReader("pwned"), 0o777); err == nil {
				if perr != nil {
					if dirfd, name, perr = openParent(rootfd, p); perr != nil {
						t.Fatalf("written %s but its parent does not resolve: %v", p, perr)
					}
				}
				assertInside(t, root, realPath(t, dirfd), "write "+p)
				var st unix.Stat_t
				if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Uid != testUID {
					t.Fatalf("written %s not found where it resolves: %v", p, err)
				}
			}
			if perr == nil {
				unix.Close(dirfd)
			}
		case 1:
			if _, err := fsys.Mkdir(p, true); err == nil {
				fd, err := resolve(rootfd, p, unix.O_PATH|unix.O_DIRECTORY)
				if err != nil {
					t.Fatalf("made %s but it does not resolve: %v", p, err)
				}
				assertInside(t, root, realPath(t, fd), "mkdir "+p)
				unix.Close(fd)
			}
		case 2:
			fsys.Remove(p, true)
		case 3:
			if r, _, err := fsys.OpenRead(p); err == nil {
				assertInside(t, root, realPath(t, int(r.Fd())), "read "+p)
				r.Close()
			}
			if fd, err := resolve(rootfd, p, unix.O_PATH); err == nil {
				assertInside(t, root, realPath(t, fd), "resolve "+p)
				unix.Close(fd)
			}
		}
		check()
	})
}
