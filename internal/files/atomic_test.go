package files

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// A tar upload that fails leaves the destination exactly as it was: new files, directories and links are gone,
// replaced files and links are back, merged directories have their old modes, and no temporary file is left.
func TestExtractAllOrNothing(t *testing.T) {
	good := []tarEntry{
		{name: "new.txt", body: "new", typ: tar.TypeReg},
		{name: "keep.txt", body: "replaced", typ: tar.TypeReg},
		{name: "sub/", typ: tar.TypeDir, mode: 0o700},
		{name: "sub/inner.txt", body: "in", typ: tar.TypeReg},
		{name: "newdir/deep/x", body: "x", typ: tar.TypeReg},
		{name: "link", link: "elsewhere", typ: tar.TypeSymlink},
		{name: "file-then-dir/", typ: tar.TypeDir},
		{name: "hard", link: "new.txt", typ: tar.TypeLink},
		{name: "keep.txt", body: "replaced twice", typ: tar.TypeReg},
	}
	for _, tc := range []struct {
		name string
		tail []byte // what follows the good entries
	}{
		{"bad entry name", makeTar(t, tarEntry{name: "../escape", body: "x", typ: tar.TypeReg})},
		{"hard link outside", makeTar(t, tarEntry{name: "h2", link: "../../etc/passwd", typ: tar.TypeLink})},
		{"through own symlink", makeTar(t, tarEntry{name: "link/x", body: "x", typ: tar.TypeReg})},
		{"protected", nil},
		{"truncated", []byte("garbage that is not a tar header, long enough to be read as one block")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, root, _ := newFS(t)
			dest := filepath.Join(root, "home/d")
			mustWrite(t, filepath.Join(dest, "keep.txt"), "old", 0o640)
			mustWrite(t, filepath.Join(dest, "sub/old.txt"), "old", 0o644)
			mustWrite(t, filepath.Join(dest, "file-then-dir"), "a file", 0o644)
			os.Chmod(filepath.Join(dest, "sub"), 0o755)
			if err := os.Symlink("keep.txt", filepath.Join(dest, "link")); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, root)

			archive := makeTar(t, good...)
			archive = archive[:len(archive)-1024] // drop the end-of-archive blocks
			tail := tc.tail
			if tc.name == "protected" {
				// Extracted at /, an entry under /dev is refused after the others went in.
				mustWrite(t, filepath.Join(root, "dev/null-placeholder"), "", 0o644)
				before = snapshot(t, root)
				archive = makeTar(t, append(prefixed("home/d/", good), tarEntry{name: "dev/evil", body: "x", typ: tar.TypeReg})...)
			} else {
				archive = append(archive, tail...)
			}
			at := "/home/d"
			if tc.name == "protected" {
				at = "/"
			}
			_, err := f.ExtractTar(at, bytes.NewReader(archive))
			if err == nil {
				t.Fatal("the upload succeeded")
			}
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("error %v, want errdefs.ErrInvalid", err)
			}
			after := snapshot(t, root)
			for k, v := range before {
				if after[k] != v {
					t.Errorf("%s: %s before, %q after", k, v, after[k])
				}
			}
			for k, v := range after {
				if _, ok := before[k]; !ok {
					t.Errorf("left behind: %s (%s)", k, v)
				}
			}
		})
	}
}

func prefixed(prefix string, es []tarEntry) []tarEntry {
	out := make([]tarEntry, len(es))
	for i, e := range es {
		e.name = prefix + e.name
		if e.typ == tar.TypeLink {
			e.link = prefix + e.link
		}
		out[i] = e
	}
	return out
}

// The same archive without the bad tail goes in whole, and leaves no backup behind.
func TestExtractCommitsWhole(t *testing.T) {
	f, root, _ := newFS(t)
	dest := filepath.Join(root, "d")
	mustWrite(t, filepath.Join(dest, "keep.txt"), "old", 0o640)
	archive := makeTar(t, tarEntry{name: "keep.txt", body: "new", typ: tar.TypeReg},
		tarEntry{name: "keep.txt", body: "newer", typ: tar.TypeReg},
		tarEntry{name: "a/b", body: "b", typ: tar.TypeReg})
	if n, err := f.ExtractTar("/d", bytes.NewReader(archive)); err != nil || n != 3 {
		t.Fatalf("extract: %d, %v", n, err)
	}
	if got := readAll(t, f, "/d/keep.txt"); got != "newer" {
		t.Errorf("keep.txt = %q", got)
	}
	for k := range snapshot(t, root) {
		if strings.Contains(k, ".ramify-") {
			t.Errorf("backup left behind: %s", k)
		}
	}
}

// /proc, /sys, /dev and what is below them are never created, replaced or removed through the API.
func TestProtectedPaths(t *testing.T) {
	f, root, _ := newFS(t)
	for _, d := range []string{"proc", "sys", "dev", "procfoo"} {
		mustWrite(t, filepath.Join(root, d, "x"), "x", 0o644)
	}
	before := snapshot(t, root)
	for _, p := range []string{"/proc", "/sys/x", "/dev", "/dev/x", "/dev/shm/y", "/proc/../dev/x"} {
		if _, err := f.Write(p, strings.NewReader("y"), 0); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("write %s: %v", p, err)
		}
		if err := f.Remove(p, true); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("remove %s: %v", p, err)
		}
		if _, err := f.Mkdir(p+"/d", true); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("mkdir %s/d: %v", p, err)
		}
		if _, err := f.ExtractTar(p, bytes.NewReader(makeTar(t, tarEntry{name: "a", body: "a", typ: tar.TypeReg}))); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("extract at %s: %v", p, err)
		}
	}
	after := snapshot(t, root)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s changed: %s → %q", k, v, after[k])
		}
	}
	// Names that only start like them are ordinary.
	if _, err := f.Write("/procfoo/x", strings.NewReader("y"), 0); err != nil {
		t.Errorf("write /procfoo/x: %v", err)
	}
	if err := f.Remove("/procfoo", true); err != nil {
		t.Errorf("remove /procfoo: %v", err)
	}
}

// A mount point is never removed (from the host, in another mount namespace, rmdir would detach the mount), and
// a kernel pseudo file system is never listed.
func TestMountPointsAndPseudoList(t *testing.T) {
	_, root, _ := newFS(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with its mount namespace
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			t.Errorf("unshare: %v", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
			t.Errorf("make private: %v", err)
			return
		}
		for _, d := range []string{"m", "p"} {
			os.Mkdir(filepath.Join(root, d), 0o755)
		}
		if err := unix.Mount("tmpfs", filepath.Join(root, "m"), "tmpfs", 0, "size=1m"); err != nil {
			t.Errorf("mount tmpfs: %v", err)
			return
		}
		defer unix.Unmount(filepath.Join(root, "m"), unix.MNT_DETACH)
		if err := unix.Mount("proc", filepath.Join(root, "p"), "proc", 0, ""); err != nil {
			t.Errorf("mount proc: %v", err)
			return
		}
		defer unix.Unmount(filepath.Join(root, "p"), unix.MNT_DETACH)
		f, err := Open(root, testUID, testGID)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		mustWrite(t, filepath.Join(root, "m", "file"), "x", 0o644)
		for _, rec := range []bool{false, true} {
			if err := f.Remove("/m", rec); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "mount point") {
				t.Errorf("remove /m (recursive %v): %v", rec, err)
			}
		}
		if _, err := os.Stat(filepath.Join(root, "m", "file")); err != nil {
			t.Errorf("the mount's file is gone: %v", err)
		}
		if _, err := f.List("/p"); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "pseudo") {
			t.Errorf("list of a proc mount: %v", err)
		}
		if _, err := f.List("/m"); err != nil {
			t.Errorf("list of a tmpfs mount: %v", err)
		}
	}()
	<-done
}

func TestCheckDir(t *testing.T) {
	f, root, _ := newFS(t)
	mustWrite(t, filepath.Join(root, "d/file"), "x", 0o644)
	os.Symlink("/d", filepath.Join(root, "l"))
	if err := f.CheckDir("/d"); err != nil {
		t.Errorf("/d: %v", err)
	}
	if err := f.CheckDir("/l"); err != nil {
		t.Errorf("/l (a symlink to a directory): %v", err)
	}
	if err := f.CheckDir("/missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("/missing: %v", err)
	}
	if err := f.CheckDir("/d/file"); !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("/d/file: %v", err)
	}
}

// /proc and /sys are never read, listed or archived, by name, whatever is mounted there.
func TestPseudoPathsNotRead(t *testing.T) {
	f, root, _ := newFS(t)
	mustWrite(t, filepath.Join(root, "proc/self/status"), "plain file", 0o644)
	mustWrite(t, filepath.Join(root, "sys/x"), "plain file", 0o644)
	for _, p := range []string{"/proc/self/status", "/sys/x"} {
		if _, _, err := f.OpenRead(p); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("read %s: %v", p, err)
		}
	}
	for _, p := range []string{"/proc", "/sys", "/proc/self"} {
		if _, err := f.List(p); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("list %s: %v", p, err)
		}
		if err := f.WriteTar(p, io.Discard); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("archive %s: %v", p, err)
		}
	}
	if _, err := f.Stat("/proc/self/status"); err != nil {
		t.Errorf("stat /proc/self/status: %v", err)
	}
}
