package image

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// fakeBuild replaces the real build step for the duration of the test. The returned counter counts calls.
func fakeBuild(t *testing.T, fn func(ctx context.Context, o Options, rootfs string) (string, error)) *atomic.Int32 {
	t.Helper()
	var calls atomic.Int32
	old := buildRootfs
	buildRootfs = func(ctx context.Context, o Options, rootfs string) (string, error) {
		calls.Add(1)
		return fn(ctx, o, rootfs)
	}
	t.Cleanup(func() { buildRootfs = old })
	return &calls
}

// writeTree makes a tiny rootfs whose etc/marker says which build produced it.
func writeTree(rootfs, marker string) error {
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(rootfs, "etc/marker"), []byte(marker), 0o644)
}

func marker(t *testing.T, img Image) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(img.Rootfs, "etc/marker"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func noTempDirs(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			t.Errorf("temporary directory %s left behind", e.Name())
		}
	}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestEnsureReusesMatchingImage(t *testing.T) {
	n := 0
	calls := fakeBuild(t, func(ctx context.Context, o Options, rootfs string) (string, error) {
		n++
		return "fake", writeTree(rootfs, "build"+string(rune('0'+n)))
	})
	dir := t.TempDir()
	ctx := context.Background()
	var progress strings.Builder
	o := Options{Dir: dir, Logger: quiet(), Progress: &progress}

	img, err := Ensure(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 || marker(t, img) != "build1" {
		t.Fatalf("first Ensure: %d builds, marker %q", calls.Load(), marker(t, img))
	}
	if img.Name != "default" || img.Rootfs != filepath.Join(dir, "default", "rootfs") || img.ID == "" || img.BuiltAt.IsZero() {
		t.Errorf("image %+v", img)
	}
	if !strings.Contains(progress.String(), "image: done in ") {
		t.Errorf("progress lacks the done line:\n%s", progress.String())
	}

	// Same options (package order and duplicates do not matter): no rebuild.
	o.Packages = append([]string{"file", "python3"}, DefaultPackages...)
	img2, err := Ensure(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 {
		t.Errorf("matching image was rebuilt")
	}
	if img2 != img {
		t.Errorf("Ensure returned %+v, want %+v", img2, img)
	}
	loaded, err := Load(dir)
	if err != nil || loaded != img {
		t.Errorf("Load = %+v, %v; want %+v", loaded, err, img)
	}

	// The manifest records what was built.
	b, err := os.ReadFile(filepath.Join(dir, "default", manifestName))
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.ID != img.ID || m.Suite != "bookworm" || len(m.Packages) != len(DefaultPackages) || m.SizeBytes != 6 ||
		m.HostUID != 100000 || m.HostGID != 100000 || !m.BuiltAt.Equal(img.BuiltAt) {
		t.Errorf("manifest %s", b)
	}

	// Force rebuilds.
	o.Force = true
	img3, err := Ensure(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 || marker(t, img3) != "build2" || img3.ID != img.ID {
		t.Errorf("Force: %d builds, marker %q", calls.Load(), marker(t, img3))
	}
	noTempDirs(t, dir)
}

func TestEnsureRebuildsWhenOptionsChange(t *testing.T) {
	calls := fakeBuild(t, func(ctx context.Context, o Options, rootfs string) (string, error) {
		return "fake", writeTree(rootfs, strings.Join(o.Packages, ","))
	})
	dir := t.TempDir()
	ctx := context.Background()
	base := Options{Dir: dir, Logger: quiet(), Packages: []string{"python3"}}
	first, err := Ensure(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	changes := []struct {
		name string
		edit func(*Options)
	}{
		{"packages", func(o *Options) { o.Packages = []string{"python3", "jq"} }},
		{"suite", func(o *Options) { o.Suite = "trixie" }},
		{"host uid", func(o *Options) { o.HostUID = 200000 }},
		{"host gid", func(o *Options) { o.HostGID = 300000 }},
	}
	prevID := first.ID
	for i, c := range changes {
		o := base
		c.edit(&o)
		img, err := Ensure(ctx, o)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if int(calls.Load()) != i+2 {
			t.Errorf("%s: changed options did not rebuild", c.name)
		}
		if strings.HasPrefix(c.name, "host") {
			if img.ID != first.ID {
				t.Errorf("%s: ID changed to %s", c.name, img.ID)
			}
		} else if img.ID == prevID {
			t.Errorf("%s: ID did not change", c.name)
		}
		prevID = img.ID
		// ... and the rebuilt one is then reused.
		if _, err := Ensure(ctx, o); err != nil || int(calls.Load()) != i+2 {
			t.Errorf("%s: rebuilt image not reused (%v)", c.name, err)
		}
	}
	if m := marker(t, mustLoad(t, dir)); m != "python3" {
		t.Errorf("marker %q", m)
	}
}

func mustLoad(t *testing.T, dir string) Image {
	t.Helper()
	img, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestEnsureRebuildsUnreadableManifest(t *testing.T) {
	calls := fakeBuild(t, func(ctx context.Context, o Options, rootfs string) (string, error) {
		return "fake", writeTree(rootfs, "x")
	})
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "default", "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "default", manifestName), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(context.Background(), Options{Dir: dir, Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 {
		t.Errorf("corrupt manifest did not cause a rebuild")
	}
}

func TestFailedBuildKeepsOldImage(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	fakeBuild(t, func(ctx context.Context, o Options, rootfs string) (string, error) {
		return "fake", writeTree(rootfs, "good")
	})
	good, err := Ensure(ctx, Options{Dir: dir, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}

	var tmpSeen string
	fakeBuild(t, func(ctx context.Context, o Options, rootfs string) (string, error) {
		tmpSeen = filepath.Dir(rootfs)
		if err := writeTree(rootfs, "half"); err != nil {
			return "", err
		}
		return "fake", errors.New("mirror exploded")
	})
	_, err = Build(ctx, Options{Dir: dir, Logger: quiet(), Packages: []string{"jq"}})
	if err == nil || !strings.Contains(err.Error(), "build image: mirror exploded") {
		t.Fatalf("Build error %v", err)
	}
	if !strings.HasPrefix(filepath.Base(tmpSeen), tmpPrefix) || filepath.Dir(tmpSeen) != dir {
		t.Errorf("build ran in %s, want %s/%sXXXX", tmpSeen, dir, tmpPrefix)
	}
	if _, err := os.Stat(tmpSeen); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("temp dir %s not removed (%v)", tmpSeen, err)
	}
	noTempDirs(t, dir)
	if img := mustLoad(t, dir); img != good || marker(t, img) != "good" {
		t.Errorf("old image changed: %+v, marker %q", img, marker(t, img))
	}
}

func TestCancelledBuildKeepsOldImage(t *testing.T) {
	dir := t.TempDir()
	fakeBuild(t, func(ctx context.Context, o Options, rootfs string) (string, error) {
		return "fake", writeTree(rootfs, "good")
	})
	good, err := Ensure(context.Background(), Options{Dir: dir, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	fakeBuild(t, func(ctx context.Context, o Options, rootfs string) (string, error) {
		if err := writeTree(rootfs, "half"); err != nil {
			return "", err
		}
		close(started)
		<-ctx.Done()
		return "fake", ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	_, err = Build(ctx, Options{Dir: dir, Logger: quiet()})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Build error %v, want context.Canceled", err)
	}
	noTempDirs(t, dir)
	if img := mustLoad(t, dir); img != good || marker(t, img) != "good" {
		t.Errorf("old image changed")
	}
}

func TestStaleTempDirsRemoved(t *testing.T) {
	fakeBuild(t, func(ctx context.Context, o Options, rootfs string) (string, error) {
		return "fake", writeTree(rootfs, "x")
	})
	dir := t.TempDir()
	stale := filepath.Join(dir, tmpPrefix+"123")
	if err := writeTree(filepath.Join(stale, "rootfs"), "stale"); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(context.Background(), Options{Dir: dir, Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
	noTempDirs(t, dir)
}

func TestRemoveTreeUnmountsFirst(t *testing.T) {
	needRoot(t)
	dir := filepath.Join(t.TempDir(), "build")
	mnt := filepath.Join(dir, "rootfs", "proc")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount tmpfs: %v", err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := removeTree(dir); err != nil {
		unix.Unmount(mnt, unix.MNT_DETACH)
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s still there: %v", dir, err)
	}
	if m, _ := mountsUnder(dir); len(m) != 0 {
		t.Errorf("still mounted: %v", m)
	}
}

func TestLoadNotFound(t *testing.T) {
	_, err := Load(t.TempDir())
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Load of an empty dir: %v, want ErrNotFound", err)
	}
}

func TestOptionsValidation(t *testing.T) {
	dir := t.TempDir()
	for _, o := range []Options{
		{},
		{Dir: dir, Packages: []string{"python3,evil"}},
		{Dir: dir, Packages: []string{"--option"}},
		{Dir: dir, Suite: "../x"},
		{Dir: dir, Mirror: "ftp://x"},
		{Dir: dir, HostUID: -1},
	} {
		if _, err := Ensure(context.Background(), o); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Ensure(%+v) = %v, want ErrInvalid", o, err)
		}
	}
	t.Setenv(MirrorEnv, "http://mirror.example/debian")
	o, err := normalize(Options{Dir: dir})
	if err != nil || o.Mirror != "http://mirror.example/debian" || o.Suite != "bookworm" || o.HostUID != 100000 {
		t.Errorf("normalize: %+v, %v", o, err)
	}
}

func TestImageID(t *testing.T) {
	a := imageID("bookworm", []string{"a", "b"})
	if a != imageID("bookworm", []string{"a", "b"}) || len(a) != 16 {
		t.Errorf("unstable or odd ID %q", a)
	}
	if a == imageID("bookworm", []string{"a"}) || a == imageID("trixie", []string{"a", "b"}) ||
		a == imageID("bookworm", []string{"ab"}) {
		t.Error("ID collision")
	}
}

func TestRunLoggedStall(t *testing.T) {
	r := newReporter(&strings.Builder{}, quiet())
	start := time.Now()
	err := runLogged(context.Background(), r, 300*time.Millisecond, "/bin/sh", "-c", "echo first; echo E: stuck; sleep 30")
	if err == nil || !strings.Contains(err.Error(), "printed nothing for 300ms") || !strings.Contains(err.Error(), "E: stuck") {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("stalled command took %s to die", d)
	}
}

func TestRunLoggedFailureQuotesTail(t *testing.T) {
	var progress strings.Builder
	r := newReporter(&progress, quiet())
	err := runLogged(context.Background(), r, time.Minute, "/bin/sh", "-c",
		`i=1; while [ $i -le 30 ]; do echo line$i; i=$((i+1)); done; echo "E: Unable to locate package nope" >&2; exit 3`)
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	if !strings.Contains(msg, "exit status 3") || !strings.Contains(msg, "line30") || !strings.Contains(msg, "line12\n") ||
		strings.Contains(msg, "line11\n") || !strings.Contains(msg, "E: Unable to locate package nope") {
		t.Errorf("error does not quote the last 20 lines:\n%s", msg)
	}
	if progress.String() != "image: error: Unable to locate package nope\n" {
		t.Errorf("progress %q", progress.String())
	}
}

func TestRunLoggedCancel(t *testing.T) {
	r := newReporter(&strings.Builder{}, quiet())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := runLogged(ctx, r, time.Minute, "/bin/sh", "-c", "sleep 30")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want DeadlineExceeded", err)
	}
}

func TestFinishTree(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "host-resolv.conf")
	if err := os.WriteFile(outside, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"etc", "var/cache/apt/archives/partial", "var/lib/apt/lists/partial", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := []string{"var/cache/apt/archives/lock", "var/cache/apt/archives/libc6_2.36_amd64.deb",
		"var/cache/apt/archives/partial/x.deb", "var/cache/apt/pkgcache.bin", "var/lib/apt/lists/lock",
		"var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease"}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(root, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	if err := finishTree(root); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "host" {
		t.Errorf("write went through the symlink: host file now %q", b)
	}
	if b, err := os.ReadFile(filepath.Join(root, "etc/hosts")); err != nil || !strings.Contains(string(b), "127.0.0.1\tlocalhost") {
		t.Errorf("hosts %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "etc/resolv.conf")); err != nil || !strings.Contains(string(b), "nameserver") ||
		strings.Contains(string(b), "127.0.0.53") {
		t.Errorf("resolv.conf %q %v", b, err)
	}
	for d, mode := range map[string]fs.FileMode{"tmp": 0o777 | fs.ModeSticky | fs.ModeDir, "root": 0o700 | fs.ModeDir,
		"run": 0o755 | fs.ModeDir, "proc": 0o555 | fs.ModeDir, "sys": 0o555 | fs.ModeDir, "dev": 0o755 | fs.ModeDir} {
		fi, err := os.Lstat(filepath.Join(root, d))
		if err != nil || fi.Mode() != mode {
			t.Errorf("/%s: %v %v, want %v", d, fi.Mode(), err, mode)
		}
	}
	for _, f := range files {
		_, err := os.Stat(filepath.Join(root, f))
		keep := strings.HasSuffix(f, "/lock") || strings.HasPrefix(f, "var/lib/apt/lists/") // lists stay for apt-get install
		if keep != (err == nil) {
			t.Errorf("%s: exists=%v, want %v", f, err == nil, keep)
		}
	}
	for _, d := range []string{"var/cache/apt/archives/partial", "var/lib/apt/lists/partial"} {
		if _, err := os.Stat(filepath.Join(root, d)); err != nil {
			t.Errorf("%s removed", d)
		}
	}
}

func TestFilterResolvConf(t *testing.T) {
	for _, tt := range []struct {
		in, want string
		ok       bool
	}{
		{"nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch .\n", "options edns0 trust-ad\nsearch .\n", false},
		{"# generated\nnameserver 10.255.255.53\n", "# generated\nnameserver 10.255.255.53\n", true},
		{"nameserver ::1\nnameserver 192.0.2.1\n", "nameserver 192.0.2.1\n", true},
		{"", "", false},
	} {
		got, ok := filterResolvConf([]byte(tt.in))
		if string(got) != tt.want || ok != tt.ok {
			t.Errorf("filterResolvConf(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestPruneCache(t *testing.T) {
	root, cache := t.TempDir(), t.TempDir()
	status := "Package: bsdutils\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1:2.38.1-5+deb12u3\n\n" +
		"Package: ncurses-base\nArchitecture: all\nVersion: 6.4-4\n"
	if err := os.MkdirAll(filepath.Join(root, "var/lib/dpkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	keep := []string{"bsdutils_1%3a2.38.1-5+deb12u3_amd64.deb", "ncurses-base_6.4-4_all.deb", "lock"}
	drop := []string{"bsdutils_1%3a2.38.1-5+deb12u2_amd64.deb", "gone_1.0_amd64.deb"}
	for _, f := range append(keep, drop...) {
		if err := os.WriteFile(filepath.Join(cache, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := pruneCache(cache, root)
	if err != nil || n != 2 {
		t.Fatalf("pruneCache = %d, %v", n, err)
	}
	for _, f := range keep {
		if _, err := os.Stat(filepath.Join(cache, f)); err != nil {
			t.Errorf("%s removed", f)
		}
	}
}

func TestRemoveDeviceNodes(t *testing.T) {
	needRoot(t)
	dev := filepath.Join(t.TempDir(), "dev")
	if err := os.MkdirAll(filepath.Join(dev, "pts"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct {
		name       string
		maj, minor uint32
	}{{"null", 1, 3}, {"console", 5, 1}, {"ptmx", 5, 2}} {
		if err := unix.Mknod(filepath.Join(dev, n.name), unix.S_IFCHR|0o666, int(unix.Mkdev(n.maj, n.minor))); err != nil {
			t.Skipf("mknod: %v", err)
		}
	}
	if err := os.Symlink("/proc/self/fd", filepath.Join(dev, "fd")); err != nil {
		t.Fatal(err)
	}
	if err := removeDeviceNodes(dev); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dev)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "fd,null,ptmx,pts" {
		t.Errorf("/dev holds %v, want fd, null, ptmx and pts", names)
	}
	if fi, err := os.Lstat(filepath.Join(dev, "null")); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Errorf("/dev/null: %v %v", fi, err)
	}
	if target, err := os.Readlink(filepath.Join(dev, "ptmx")); err != nil || target != "pts/ptmx" {
		t.Errorf("/dev/ptmx -> %q, %v", target, err)
	}
	if err := removeDeviceNodes(filepath.Join(t.TempDir(), "none")); err != nil {
		t.Errorf("missing /dev: %v", err)
	}
}
