package image

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRealBuild builds the real default image. It needs root and network access to a Debian mirror and takes
// a minute or more, so it only runs with RAMIFY_TEST_IMAGE_BUILD=1. RAMIFY_TEST_IMAGE_DIR picks the images
// directory (default: a temporary one).
func TestRealBuild(t *testing.T) {
	if os.Getenv("RAMIFY_TEST_IMAGE_BUILD") != "1" {
		t.Skip("real image build skipped: set RAMIFY_TEST_IMAGE_BUILD=1 (needs root and a Debian mirror)")
	}
	needRoot(t)
	dir := os.Getenv("RAMIFY_TEST_IMAGE_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var progress strings.Builder
	start := time.Now()
	img, err := Ensure(ctx, Options{Dir: dir, Progress: &progress})
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Ensure took %s: %+v", time.Since(start).Round(time.Second), img)

	for _, p := range []string{"usr/bin/python3", "usr/bin/curl", "usr/bin/git", "usr/bin/jq", "etc/hosts", "etc/resolv.conf"} {
		if _, err := os.Lstat(filepath.Join(img.Rootfs, p)); err != nil {
			t.Errorf("/%s: %v", p, err)
		}
	}
	for _, p := range []string{"", "etc/passwd", "usr/bin/python3", "tmp", "root"} {
		uid, gid, _ := owner(t, filepath.Join(img.Rootfs, p))
		if uid != DefaultHostID || gid != DefaultHostID {
			t.Errorf("/%s owned by %d:%d", p, uid, gid)
		}
	}
	if _, _, mode := owner(t, filepath.Join(img.Rootfs, "usr/bin/passwd")); mode&0o4000 == 0 {
		t.Errorf("/usr/bin/passwd lost its setuid bit: %o", mode)
	}
	if ents, _ := filepath.Glob(filepath.Join(img.Rootfs, "var/cache/apt/archives/*.deb")); len(ents) > 0 {
		t.Errorf("%d .deb files left in the image", len(ents))
	}
	if ents, err := os.ReadDir(filepath.Join(img.Rootfs, "dev")); err == nil {
		for _, e := range ents {
			if e.Type()&os.ModeDevice != 0 && !containsStr(keptDevices, e.Name()) {
				t.Errorf("device node /dev/%s left in the image", e.Name())
			}
		}
	}
	// The shifted tree still works (chroot as host root; the files are owned by 100000 but readable).
	out, err := exec.CommandContext(ctx, findExe("chroot"), img.Rootfs, "python3", "-c",
		"import numpy, pandas, dill; print(numpy.__version__)").CombinedOutput()
	if err != nil {
		t.Errorf("python3 in the image: %v\n%s", err, out)
	}

	// A second Ensure reuses it.
	start = time.Now()
	img2, err := Ensure(ctx, Options{Dir: dir})
	if err != nil || img2 != img {
		t.Errorf("second Ensure: %+v, %v", img2, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("second Ensure took %s", d)
	}
}
