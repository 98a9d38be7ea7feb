package layer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// runDriverSuite runs the behaviour every Driver must have. newDriver returns a fresh, empty driver whose
// teardown is registered with t.Cleanup.
func runDriverSuite(t *testing.T, newDriver func(t *testing.T) Driver) {
	t.Run("CreateListRemove", func(t *testing.T) { testCreateListRemove(t, newDriver(t)) })
	t.Run("CloneIndependence", func(t *testing.T) { testCloneIndependence(t, newDriver(t)) })
	t.Run("ClonePreserves", func(t *testing.T) { testClonePreserves(t, newDriver(t)) })
	t.Run("CloneMissingSource", func(t *testing.T) { testCloneMissing(t, newDriver(t)) })
	t.Run("CloneAtomic", func(t *testing.T) { testCloneAtomic(t, newDriver(t)) })
	t.Run("InvalidIDs", func(t *testing.T) { testInvalidIDs(t, newDriver(t)) })
	t.Run("RemoveContents", func(t *testing.T) { testRemoveContents(t, newDriver(t)) })
	t.Run("Limits", func(t *testing.T) { testLimits(t, newDriver(t)) })
}

func mustList(t *testing.T, d Driver) []string {
	t.Helper()
	ids, err := d.List()
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return ids
}

func mustCreate(t *testing.T, d Driver, id string) string {
	t.Helper()
	p, err := d.Create(context.Background(), id)
	if err != nil {
		t.Fatalf("Create(%q): %v", id, err)
	}
	return p
}

func mustClone(t *testing.T, d Driver, src, dst string) string {
	t.Helper()
	p, err := d.Clone(context.Background(), src, dst)
	if err != nil {
		t.Fatalf("Clone(%q, %q): %v", src, dst, err)
	}
	return p
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func testCreateListRemove(t *testing.T, d Driver) {
	ctx := context.Background()
	if got := mustList(t, d); len(got) != 0 {
		t.Fatalf("new driver lists %v, want nothing", got)
	}
	pa := mustCreate(t, d, "a")
	mustCreate(t, d, "b-1.x_y")
	if pa != d.Path("a") {
		t.Errorf("Create returned %q, Path says %q", pa, d.Path("a"))
	}
	fi, err := os.Lstat(pa)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o755 {
		t.Errorf("new layer is %v, want a 0755 directory", fi.Mode())
	}
	if names, _ := os.ReadDir(pa); len(names) != 0 {
		t.Errorf("new layer is not empty: %v", names)
	}
	if got, want := mustList(t, d), []string{"a", "b-1.x_y"}; !reflect.DeepEqual(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	if _, err := d.Create(ctx, "a"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Create of an existing layer: err = %v, want ErrConflict", err)
	}
	writeFile(t, filepath.Join(pa, "f"), "x")
	if err := d.Remove(ctx, "a"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := os.Lstat(pa); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("removed layer still there: %v", err)
	}
	if got, want := mustList(t, d), []string{"b-1.x_y"}; !reflect.DeepEqual(got, want) {
		t.Errorf("List after Remove = %v, want %v", got, want)
	}
	if err := d.Remove(ctx, "a"); err != nil {
		t.Errorf("second Remove: %v, want nil", err)
	}
	if err := d.Remove(ctx, "never-was"); err != nil {
		t.Errorf("Remove of a missing layer: %v, want nil", err)
	}
	// The id can be reused.
	mustCreate(t, d, "a")
}

func testCloneIndependence(t *testing.T, d Driver) {
	ctx := context.Background()
	src := mustCreate(t, d, "src")
	writeFile(t, filepath.Join(src, "shared"), "one")
	dst := mustClone(t, d, "src", "dst")
	if dst != d.Path("dst") {
		t.Errorf("Clone returned %q, Path says %q", dst, d.Path("dst"))
	}
	if tmps := listTemps(filepath.Dir(dst)); len(tmps) > 0 {
		t.Errorf("a clone left temporary entries behind: %v", tmps)
	}
	if got := readFile(t, filepath.Join(dst, "shared")); got != "one" {
		t.Fatalf("clone reads %q, want %q", got, "one")
	}
	writeFile(t, filepath.Join(dst, "shared"), "two")
	writeFile(t, filepath.Join(dst, "only-dst"), "d")
	writeFile(t, filepath.Join(src, "only-src"), "s")
	if got := readFile(t, filepath.Join(src, "shared")); got != "one" {
		t.Errorf("write in clone changed source: %q", got)
	}
	if _, err := os.Lstat(filepath.Join(src, "only-dst")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("file created in clone visible in source: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "only-src")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("file created in source visible in clone: %v", err)
	}
	// Cloning a clone, and removing the source does not hurt the clone.
	mustClone(t, d, "dst", "dst2")
	if err := d.Remove(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(d.Path("dst2"), "shared")); got != "two" {
		t.Errorf("clone of clone reads %q, want %q", got, "two")
	}
	if _, err := d.Clone(ctx, "dst", "dst2"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Clone onto an existing layer: err = %v, want ErrConflict", err)
	}
	if got, want := mustList(t, d), []string{"dst", "dst2"}; !reflect.DeepEqual(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
}

var (
	testTime1 = time.Date(2020, 1, 2, 3, 4, 5, 123456789, time.UTC)
	testTime2 = time.Date(2021, 6, 7, 8, 9, 10, 987654321, time.UTC)
)

func setTimes(t *testing.T, path string, mtime time.Time) {
	t.Helper()
	ts := []unix.Timespec{unix.NsecToTimespec(testTime2.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatalf("utimes %s: %v", path, err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// populateUpper fills dir with what an overlayfs upper directory may hold.
func populateUpper(t *testing.T, dir string) {
	const uid, gid = 100000, 100000
	p := func(name string) string { return filepath.Join(dir, name) }

	must(t, os.WriteFile(p("file"), []byte("hello layer\n"), 0o640))
	must(t, os.Lchown(p("file"), uid, gid))
	must(t, os.Chmod(p("file"), 0o640))
	must(t, unix.Lsetxattr(p("file"), "user.overlay.origin", []byte{0, 1, 2, 0xff}, 0))
	must(t, unix.Lsetxattr(p("file"), "trusted.overlay.metacopy", nil, 0))

	must(t, os.WriteFile(p("empty"), nil, 0o600))
	must(t, os.Lchown(p("empty"), uid+5, gid+7))

	must(t, os.WriteFile(p("suid"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.Lchown(p("suid"), uid, gid))
	must(t, os.Chmod(p("suid"), 0o4755|os.ModeSetuid|os.ModeSetgid))

	must(t, os.Mkdir(p("sub"), 0o700))
	must(t, os.Link(p("file"), p("sub/hard")))            // hard link across directories
	must(t, os.Link(p("file"), p("hard2")))               // three names, one inode
	must(t, os.Symlink("../file", p("sub/link")))         // relative symlink
	must(t, os.Symlink("/does/not/exist", p("dangling"))) // dangling symlink
	must(t, os.Link(p("dangling"), p("dangling-hard")))   // hard link to a symlink
	must(t, os.Lchown(p("sub/link"), uid+1, gid+1))       // symlink ownership
	must(t, unix.Lsetxattr(p("sub/link"), "trusted.overlay.x", []byte("v"), 0))
	must(t, os.Lchown(p("sub"), uid, gid))
	must(t, os.Chmod(p("sub"), 0o2775|os.ModeSetgid))

	must(t, os.Mkdir(p("opaque"), 0o755))
	must(t, os.Lchown(p("opaque"), uid, gid))
	must(t, unix.Lsetxattr(p("opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(t, unix.Lsetxattr(p("opaque"), "user.overlay.opaque", []byte("y"), 0))
	must(t, os.Mkdir(p("opaque/tmp"), 0o777))
	must(t, os.Chmod(p("opaque/tmp"), 0o1777|os.ModeSticky))

	// Whiteouts: 0/0 character devices, owned by the sandbox's root; overlayfs may hard-link them.
	must(t, unix.Mknod(p("whiteout"), unix.S_IFCHR|0o000, 0))
	must(t, os.Lchown(p("whiteout"), uid, gid))
	must(t, os.Link(p("whiteout"), p("opaque/whiteout2")))
	must(t, unix.Mknod(p("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(t, unix.Mknod(p("blk"), unix.S_IFBLK|0o660, int(unix.Mkdev(7, 200))))
	must(t, unix.Mkfifo(p("fifo"), 0o620))
	must(t, os.Lchown(p("fifo"), uid+2, gid+2))

	// A sparse file with data in the middle.
	f, err := os.Create(p("sparse"))
	must(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte("s"), 4096), 4<<20)
	must(t, err)
	must(t, f.Truncate(8<<20))
	must(t, f.Close())

	// Times last, directories after their contents.
	for _, name := range []string{"file", "empty", "suid", "sub/link", "dangling", "whiteout", "null", "blk", "fifo", "sparse", "opaque/tmp"} {
		setTimes(t, p(name), testTime1)
	}
	setTimes(t, p("sub"), testTime1)
	setTimes(t, p("opaque"), testTime1)
	must(t, os.Lchown(dir, uid, gid))
	must(t, os.Chmod(dir, 0o751))
	must(t, unix.Lsetxattr(dir, "trusted.overlay.opaque", []byte("y"), 0))
	setTimes(t, dir, testTime2)
}

// nodeInfo is what must survive a clone, for one path.
type nodeInfo struct {
	Mode     uint32
	UID, GID uint32
	Rdev     uint64
	Size     int64
	Mtime    unix.Timespec
	Link     string
	Sum      [32]byte
	Xattrs   map[string]string
	LinkedTo string // for hard links: the first path (sorted) of the inode
}

// snapshotTree describes every node under root.
func snapshotTree(t *testing.T, root string) map[string]nodeInfo {
	t.Helper()
	out := map[string]nodeInfo{}
	firstPath := map[uint64]string{}
	var paths []string
	err := filepath.WalkDir(root, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		paths = append(paths, path)
		return nil
	})
	must(t, err)
	sort.Strings(paths)
	for _, path := range paths {
		rel, _ := filepath.Rel(root, path)
		var st unix.Stat_t
		must(t, unix.Lstat(path, &st))
		n := nodeInfo{Mode: st.Mode, UID: st.Uid, GID: st.Gid, Rdev: st.Rdev, Size: st.Size, Mtime: st.Mtim, Xattrs: map[string]string{}}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(path)
			must(t, err)
			n.Sum = sha256.Sum256(b)
		case unix.S_IFLNK:
			n.Link, err = os.Readlink(path)
			must(t, err)
		case unix.S_IFDIR:
			n.Size = 0 // directory sizes are file-system specific
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
			if first, ok := firstPath[st.Ino]; ok {
				n.LinkedTo = first
			} else {
				firstPath[st.Ino] = rel
			}
		}
		buf := make([]byte, 64<<10)
		sz, err := unix.Llistxattr(path, buf)
		must(t, err)
		for _, name := range strings.Split(string(buf[:sz]), "\x00") {
			if name == "" || strings.HasPrefix(name, "security.selinux") {
				continue
			}
			v := make([]byte, 64<<10)
			vs, err := unix.Lgetxattr(path, name, v)
			must(t, err)
			n.Xattrs[name] = string(v[:vs])
		}
		out[rel] = n
	}
	return out
}

func testClonePreserves(t *testing.T, d Driver) {
	src := mustCreate(t, d, "src")
	populateUpper(t, src)
	before := snapshotTree(t, src)
	dst := mustClone(t, d, "src", "dst")
	after := snapshotTree(t, dst)
	if !reflect.DeepEqual(before, after) {
		for k, v := range before {
			if w, ok := after[k]; !ok {
				t.Errorf("%s: missing in clone", k)
			} else if !reflect.DeepEqual(v, w) {
				t.Errorf("%s: source %+v\n clone %+v", k, v, w)
			}
		}
		for k := range after {
			if _, ok := before[k]; !ok {
				t.Errorf("%s: only in clone", k)
			}
		}
	}
	// The source must be untouched by the clone, including times.
	if again := snapshotTree(t, src); !reflect.DeepEqual(before, again) {
		t.Errorf("cloning changed the source")
	}

	// Spot checks of the properties that matter most, with readable messages.
	var st unix.Stat_t
	must(t, unix.Lstat(filepath.Join(dst, "whiteout"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 || st.Uid != 100000 {
		t.Errorf("whiteout: mode %#o rdev %d uid %d, want a 0/0 char device owned by 100000", st.Mode, st.Rdev, st.Uid)
	}
	must(t, unix.Lstat(filepath.Join(dst, "suid"), &st))
	if st.Mode&0o7777 != 0o6755 || st.Uid != 100000 {
		t.Errorf("suid: mode %#o uid %d, want 06755 and 100000", st.Mode&0o7777, st.Uid)
	}
	v := make([]byte, 16)
	n, err := unix.Lgetxattr(filepath.Join(dst, "opaque"), "trusted.overlay.opaque", v)
	if err != nil || string(v[:n]) != "y" {
		t.Errorf("trusted.overlay.opaque = %q, %v; want \"y\"", v[:n], err)
	}
	var a, b unix.Stat_t
	must(t, unix.Lstat(filepath.Join(dst, "file"), &a))
	must(t, unix.Lstat(filepath.Join(dst, "sub/hard"), &b))
	if a.Ino != b.Ino || a.Nlink != 3 {
		t.Errorf("hard links not preserved: inodes %d/%d, nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	must(t, unix.Lstat(filepath.Join(dst, "sparse"), &st))
	if st.Blocks*512 > 1<<20 {
		t.Errorf("sparse file takes %d bytes in the clone, want holes preserved", st.Blocks*512)
	}
	if !time.Unix(rootMtime(t, dst)).Equal(testTime2) {
		t.Errorf("layer root mtime %v, want %v", time.Unix(rootMtime(t, dst)), testTime2)
	}
}

func rootMtime(t *testing.T, path string) (int64, int64) {
	var st unix.Stat_t
	must(t, unix.Lstat(path, &st))
	return st.Mtim.Unix()
}

func testCloneMissing(t *testing.T, d Driver) {
	_, err := d.Clone(context.Background(), "nope", "dst")
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Clone of a missing layer: err = %v, want ErrNotFound", err)
	}
	if !strings.Contains(err.Error(), "nope") {
		t.Errorf("error %q does not name the layer", err)
	}
	if got := mustList(t, d); len(got) != 0 {
		t.Errorf("failed clone left %v", got)
	}
	if _, err := os.Lstat(d.Path("dst")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("failed clone left its destination: %v", err)
	}
}

// countdownCtx is a context that reports cancellation after its Err has been consulted n times.
type countdownCtx struct {
	context.Context
	n atomic.Int64
}

func (c *countdownCtx) Err() error {
	if c.n.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

func testCloneAtomic(t *testing.T, d Driver) {
	src := mustCreate(t, d, "src")
	for i := 0; i < 50; i++ {
		writeFile(t, filepath.Join(src, fmt.Sprintf("f%02d", i)), strings.Repeat("x", i))
	}
	root := filepath.Dir(d.Path("src"))
	for _, after := range []int64{0, 1, 3, 20, 1000} {
		ctx := &countdownCtx{Context: context.Background()}
		ctx.n.Store(after)
		_, err := d.Clone(ctx, "src", "dst")
		entries, rerr := os.ReadDir(root)
		must(t, rerr)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".") {
				t.Errorf("cancel after %d: clone left %s", after, e.Name())
			}
		}
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("cancel after %d: err = %v, want context.Canceled", after, err)
			}
			if _, err := os.Lstat(d.Path("dst")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("cancel after %d: failed clone left its destination", after)
			}
			continue
		}
		// Either nothing or everything.
		if names, _ := os.ReadDir(d.Path("dst")); len(names) != 50 {
			t.Errorf("cancel after %d: successful clone holds %d entries, want 50", after, len(names))
		}
		must(t, d.Remove(context.Background(), "dst"))
	}
}

var invalidIDs = []string{"", ".", "..", ".hidden", "a/b", "../x", "/abs", strings.Repeat("a", MaxIDLen+1), "a b", "é", "a\x00b", "a:b"}

func testInvalidIDs(t *testing.T, d Driver) {
	ctx := context.Background()
	mustCreate(t, d, "ok")
	for _, id := range invalidIDs {
		if _, err := d.Create(ctx, id); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Create(%q): err = %v, want ErrInvalid", id, err)
		}
		if _, err := d.Clone(ctx, id, "x"); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Clone(%q, x): err = %v, want ErrInvalid", id, err)
		}
		if _, err := d.Clone(ctx, "ok", id); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Clone(ok, %q): err = %v, want ErrInvalid", id, err)
		}
		if err := d.Remove(ctx, id); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Remove(%q): err = %v, want ErrInvalid", id, err)
		}
	}
	if got, want := mustList(t, d), []string{"ok"}; !reflect.DeepEqual(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	// A maximal id works.
	mustCreate(t, d, strings.Repeat("z", MaxIDLen))
}

func testRemoveContents(t *testing.T, d Driver) {
	p := mustCreate(t, d, "full")
	populateUpper(t, p)
	must(t, os.MkdirAll(filepath.Join(p, "ro/deep/er"), 0o755))
	writeFile(t, filepath.Join(p, "ro/deep/er/f"), "x")
	must(t, os.Chmod(filepath.Join(p, "ro/deep"), 0o500))
	must(t, os.Chmod(filepath.Join(p, "ro"), 0o000))
	mustClone(t, d, "full", "full2")
	for _, id := range []string{"full", "full2"} {
		if err := d.Remove(context.Background(), id); err != nil {
			t.Fatalf("Remove(%s): %v", id, err)
		}
		if _, err := os.Lstat(d.Path(id)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still exists after Remove", id)
		}
	}
	if got := mustList(t, d); len(got) != 0 {
		t.Errorf("List = %v after removing everything", got)
	}
}
