package layer

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// requireRoot skips tests that mount file systems, attach loop devices, chown to 100000 or set trusted.*
// extended attributes: all of that needs root (CAP_SYS_ADMIN, CAP_CHOWN, CAP_MKNOD).
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts btrfs on loop devices, chowns to uid 100000 and sets trusted.* xattrs")
	}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

const testImageSize = 2 << 30

// unmountLoop unmounts the loop-backed btrfs at mnt and makes sure its loop device is detached.
func unmountLoop(t testing.TB, mnt string) {
	t.Helper()
	dev := mountSource(mnt)
	if dev == "" {
		return
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Errorf("unmount %s: %v; detaching lazily", mnt, err)
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
	}
	if mountSource(mnt) != "" {
		t.Errorf("%s is still mounted", mnt)
	}
	backing := "/sys/block/" + filepath.Base(dev) + "/loop/backing_file"
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(backing); err != nil {
			return // autoclear did its job
		}
	}
	t.Errorf("%s not detached by autoclear; detaching explicitly", dev)
	if fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		_ = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
		unix.Close(fd)
	}
}

// openBtrfs opens a btrfs driver on a new loop image in a temporary directory and tears it all down at the
// end of the test.
func openBtrfs(t testing.TB) (Driver, string) {
	t.Helper()
	return openBtrfsQuota(t, "")
}

// openBtrfsQuota is openBtrfs with quota mode quota ("" is Open's default).
func openBtrfsQuota(t testing.TB, quota QuotaMode) (Driver, string) {
	t.Helper()
	requireRoot(t)
	dir := t.TempDir()
	d, err := Open(context.Background(), dir, Options{Driver: "btrfs", ImageSize: testImageSize, Logger: testLogger(t), Quota: quota})
	if err != nil {
		t.Fatalf("Open btrfs: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		unmountLoop(t, filepath.Join(dir, mountName))
	})
	if d.Name() != "btrfs" {
		t.Fatalf("driver %q, want btrfs", d.Name())
	}
	return d, dir
}

func openCopy(t testing.TB, dir string) Driver {
	t.Helper()
	requireRoot(t)
	d, err := Open(context.Background(), dir, Options{Driver: "copy", Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("Open copy: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	if d.Name() != "copy" {
		t.Fatalf("driver %q, want copy", d.Name())
	}
	return d
}

func TestCopyDriver(t *testing.T) {
	runDriverSuite(t, func(t *testing.T) Driver { return openCopy(t, t.TempDir()) })
}

func TestBtrfsDriver(t *testing.T) {
	runDriverSuite(t, func(t *testing.T) Driver { d, _ := openBtrfs(t); return d })
}

// TestCopyDriverOnBtrfs runs the copy driver where FICLONE works, exercising the reflink path.
func TestCopyDriverOnBtrfs(t *testing.T) {
	runDriverSuite(t, func(t *testing.T) Driver {
		host, _ := openBtrfs(t)
		return openCopy(t, mustCreate(t, host, "host"))
	})
}

// TestBtrfsNative opens on a directory that is itself on btrfs: layers are subvolumes right there.
func TestBtrfsNative(t *testing.T) {
	runDriverSuite(t, func(t *testing.T) Driver {
		host, _ := openBtrfs(t)
		dir := mustCreate(t, host, "data")
		d, err := Open(context.Background(), dir, Options{Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		if d.Name() != "btrfs" || d.Path("x") != filepath.Join(dir, "x") {
			t.Fatalf("driver %s with layers at %s, want btrfs directly in %s", d.Name(), d.Path("x"), dir)
		}
		if _, err := os.Lstat(filepath.Join(dir, imageName)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("native btrfs created an image")
		}
		return d
	})
}

func TestBtrfsCloneIsSnapshot(t *testing.T) {
	d, _ := openBtrfs(t)
	src := mustCreate(t, d, "src")
	// 256 MiB of data: a copy would be slow and take space; a snapshot is neither.
	f, err := os.Create(filepath.Join(src, "big"))
	must(t, err)
	_, err = io.Copy(f, io.LimitReader(zeroReader{}, 256<<20))
	must(t, err)
	must(t, f.Close())
	start := time.Now()
	dst := mustClone(t, d, "src", "dst")
	t.Logf("snapshot of a 256 MiB layer took %v", time.Since(start))
	var st unix.Stat_t
	must(t, unix.Lstat(dst, &st))
	if st.Ino != btrfsFirstFreeObjID {
		t.Errorf("clone root has inode %d, want %d (a subvolume)", st.Ino, btrfsFirstFreeObjID)
	}
	// Shared extents: the clone's file is a reflink of the source's, so FIEMAP reports it shared. Simpler and
	// enough: the data is the same and the clone is independent (the suite checks that).
	if fi, err := os.Stat(filepath.Join(dst, "big")); err != nil || fi.Size() != 256<<20 {
		t.Errorf("clone's big file: %v, %v", fi, err)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'z'
	}
	return len(p), nil
}

// TestBtrfsRemoveNested removes a layer holding nested subvolumes (the snapshot-destroy ioctl refuses those).
func TestBtrfsRemoveNested(t *testing.T) {
	d, _ := openBtrfs(t)
	p := mustCreate(t, d, "outer")
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	must(t, btrfsSubvolCreate(fd, "inner"))
	unix.Close(fd)
	writeFile(t, filepath.Join(p, "inner", "f"), "x")
	must(t, os.Mkdir(filepath.Join(p, "dir"), 0o755))
	fd, err = unix.Open(filepath.Join(p, "dir"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	must(t, btrfsSubvolCreate(fd, "deeper"))
	unix.Close(fd)
	if err := d.Remove(context.Background(), "outer"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("layer still exists")
	}
	// A plain directory (not a subvolume) under the root is removed too, and can be cloned (by copying).
	plain := filepath.Join(filepath.Dir(p), "plain")
	must(t, os.MkdirAll(filepath.Join(plain, "a/b"), 0o755))
	writeFile(t, filepath.Join(plain, "a/b/f"), "y")
	c := mustClone(t, d, "plain", "plain2")
	if got := readFile(t, filepath.Join(c, "a/b/f")); got != "y" {
		t.Errorf("clone of a plain directory reads %q", got)
	}
	for _, id := range []string{"plain", "plain2"} {
		if err := d.Remove(context.Background(), id); err != nil {
			t.Fatalf("Remove(%s): %v", id, err)
		}
	}
}

// TestRestart reopens the same directory as a restarted server would: first with the image still mounted,
// then after an unmount (a reboot), when the image must be mounted again without being reformatted.
func TestRestart(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	mnt := filepath.Join(dir, mountName)
	t.Cleanup(func() { unmountLoop(t, mnt) })
	open := func() Driver {
		t.Helper()
		d, err := Open(ctx, dir, Options{ImageSize: testImageSize, Logger: testLogger(t)})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if d.Name() != "btrfs" {
			t.Fatalf("driver %s, want btrfs", d.Name())
		}
		return d
	}
	d := open()
	p := mustCreate(t, d, "keep")
	writeFile(t, filepath.Join(p, "data"), "persist")
	must(t, d.Close())
	if mountSource(mnt) == "" {
		t.Fatal("Close unmounted the layers")
	}
	dev := mountSource(mnt)

	d = open()
	if got := mustList(t, d); len(got) != 1 || got[0] != "keep" {
		t.Fatalf("after restart List = %v", got)
	}
	if src := mountSource(mnt); src != dev {
		t.Errorf("restart mounted %s again (was %s), want reuse", src, dev)
	}
	must(t, d.Close())

	unmountLoop(t, mnt)
	d = open()
	defer d.Close()
	if got := readFile(t, filepath.Join(d.Path("keep"), "data")); got != "persist" {
		t.Fatalf("after remount data = %q", got)
	}
	if n := strings.Count(readMountinfo(t), " "+mnt+" "); n != 1 {
		t.Errorf("%s mounted %d times, want once", mnt, n)
	}
}

func readMountinfo(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	must(t, err)
	return string(b)
}

// TestFallback simulates hosts where btrfs cannot be had: Open falls back to the copy driver, leaves no image
// behind, and keeps the copy driver once it holds layers.
func TestFallback(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		loopCtl, mkfs string
	}{
		{"no loop devices", "/nonexistent/loop-control", mkfsBtrfs},
		{"mkfs missing", loopControlPath, "/nonexistent/mkfs.btrfs"},
		{"mkfs fails", loopControlPath, "false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			oldCtl, oldMkfs := loopControlPath, mkfsBtrfs
			loopControlPath, mkfsBtrfs = tc.loopCtl, tc.mkfs
			defer func() { loopControlPath, mkfsBtrfs = oldCtl, oldMkfs }()
			dir := t.TempDir()
			var logs bytes.Buffer
			d, err := Open(ctx, dir, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if d.Name() != "copy" {
				t.Fatalf("driver %s, want copy", d.Name())
			}
			if !strings.Contains(logs.String(), "falling back") {
				t.Errorf("fallback not logged: %s", logs.String())
			}
			for _, name := range []string{imageName, imageName + ".tmp"} {
				if _, err := os.Lstat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("fallback left %s behind", name)
				}
			}
			if _, err := Open(ctx, t.TempDir(), Options{Driver: "btrfs", Logger: testLogger(t)}); err == nil {
				t.Errorf("explicit btrfs without btrfs support succeeded")
			}
			mustCreate(t, d, "l1")
			loopControlPath, mkfsBtrfs = oldCtl, oldMkfs
			// btrfs is possible now, but the copy layers stay in charge.
			d2, err := Open(ctx, dir, Options{Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer d2.Close()
			if d2.Name() != "copy" || len(mustList(t, d2)) != 1 {
				t.Errorf("reopen with layers present: driver %s, layers %v; want copy with l1", d2.Name(), mustList(t, d2))
			}
			if _, err := Open(ctx, dir, Options{Driver: "btrfs", Logger: testLogger(t)}); !errors.Is(err, errdefs.ErrConflict) {
				t.Errorf("explicit btrfs over copy layers: err = %v, want ErrConflict", err)
			}
		})
	}
}

// TestBrokenImage: an existing image that cannot be mounted is an error (not a silent switch to copy), and
// leaves no loop device behind.
func TestBrokenImage(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	img := filepath.Join(dir, imageName)
	must(t, os.WriteFile(img, make([]byte, 1<<20), 0o600))
	_, err := Open(context.Background(), dir, Options{Logger: testLogger(t)})
	if err == nil {
		unmountLoop(t, filepath.Join(dir, mountName))
		t.Fatal("Open on a broken image succeeded")
	}
	t.Logf("Open: %v", err)
	for deadline := time.Now().Add(5 * time.Second); findLoop(img) != ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			dev := findLoop(img)
			t.Errorf("loop device %s left attached", dev)
			if fd, err := unix.Open(dev, unix.O_RDONLY, 0); err == nil {
				_ = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
				unix.Close(fd)
			}
			break
		}
	}
}

func TestOpenOptions(t *testing.T) {
	ctx := context.Background()
	if _, err := Open(ctx, t.TempDir(), Options{Driver: "zfs"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("unknown driver: err = %v, want ErrInvalid", err)
	}
	if _, err := Open(ctx, t.TempDir(), Options{ImageSize: 1 << 20}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("tiny image: err = %v, want ErrInvalid", err)
	}
}

func TestIoctlNumbers(t *testing.T) {
	// Values from the kernel headers (_IOW(0x94, nr, 4096-byte struct)).
	for name, c := range map[string]struct{ got, want uintptr }{
		"BTRFS_IOC_SUBVOL_CREATE":  {btrfsIocSubvolCreate, 0x5000940e},
		"BTRFS_IOC_SNAP_DESTROY":   {btrfsIocSnapDestroy, 0x5000940f},
		"BTRFS_IOC_SNAP_CREATE_V2": {btrfsIocSnapCreateV2, 0x50009417},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", name, c.got, c.want)
		}
	}
}

func TestValidateID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"a", true},
		{"sbx-01HZX.layer_2", true},
		{"A-Z.0_9", true},
		{"a..b", true},
		{"-leading-dash", true},
		{strings.Repeat("x", MaxIDLen), true},
		{"", false},
		{".", false},
		{"..", false},
		{".hidden", false},
		{".tmp-clone-x", false},
		{"a/b", false},
		{"/", false},
		{"../etc", false},
		{strings.Repeat("x", MaxIDLen+1), false},
		{"with space", false},
		{"tab\t", false},
		{"nul\x00", false},
		{"ümlaut", false},
		{"a*", false},
		{"a\\b", false},
	} {
		err := ValidateID(tc.id)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateID(%q) = %v, want ok=%v", tc.id, err, tc.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ValidateID(%q) = %v, not ErrInvalid", tc.id, err)
		}
	}
}

var validIDRe = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$`)

func FuzzValidateID(f *testing.F) {
	for _, s := range append(invalidIDs, "a", "layer-1", "x.y", strings.Repeat("b", MaxIDLen)) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := ValidateID(id)
		if want := validIDRe.MatchString(id); (err == nil) != want {
			t.Fatalf("ValidateID(%q) = %v, regexp says valid=%v", id, err, want)
		}
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("ValidateID(%q) = %v, not ErrInvalid", id, err)
			}
			return
		}
		// A valid id names exactly one entry directly inside the layer root.
		if p := filepath.Join("/root", id); filepath.Dir(p) != "/root" || filepath.Base(p) != id {
			t.Fatalf("valid id %q escapes or is not a single path element: %s", id, p)
		}
		if len(id) > btrfsVolNameMax || strings.HasPrefix(id, ".") {
			t.Fatalf("valid id %q is unusable as a subvolume name", id)
		}
	})
}
