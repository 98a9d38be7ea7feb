package image

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/testserver"
)

func TestNamedOptionsNormalize(t *testing.T) {
	ok := NamedOptions{Dir: "/x", Name: "ml-1.0", Apt: []string{"tree", " jq", "tree"}, Pip: []string{"attrs==23.1.0", "requests[socks]>=2,<3"},
		PipIndex: "http://127.0.0.1:1/simple/"}
	n, err := ok.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(n.Apt, ",") != "jq,tree" || len(n.Pip) != 2 {
		t.Errorf("normalized: %+v", n)
	}
	for _, bad := range []NamedOptions{
		{Name: "Bad"}, {Name: ""}, {Name: "default", Apt: []string{"tree"}}, {Name: "../x", Apt: []string{"tree"}},
		{Name: "a", Apt: []string{"tree;rm"}},
		{Name: "a"},
		{Name: "a", Pip: []string{"x"}},
		{Name: "a", Pip: []string{"x"}, PipIndex: "ftp://h/"},
		{Name: "a", Pip: []string{"--index-url=http://evil/ x"}, PipIndex: "http://h/"},
		{Name: "a", Pip: []string{"git+https://h/x"}, PipIndex: "http://h/"},
		{Name: "a", Apt: []string{"tree"}, PipIndex: "http://h/"},
	} {
		if _, err := bad.Normalize(); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: %v, want invalid", bad, err)
		}
	}
}

// TestBuildNamedReal builds a named image with one Debian package and one pip requirement from a local index on
// top of the shared default image (in a fresh images directory: the shared one is not touched), and checks the
// layer, the manifest, what the default image looks like afterwards, and removal.
func TestBuildNamedReal(t *testing.T) {
	needRoot(t)
	dir := testserver.ImageDir(t)
	index := testserver.ServePyIndex(t, testserver.PyPackage{Name: "ramify-hello", Version: "1.2.3", Module: "ramify_hello",
		Source: "def hello():\n    return 'hello from a wheel'\n"})
	base, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(base.Rootfs, "usr/bin/tree")); err == nil {
		t.Fatal("the default image already has tree: pick another package")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var progress strings.Builder
	img, err := BuildNamed(ctx, NamedOptions{Dir: dir, Name: "hello", Apt: []string{"tree"}, Pip: []string{"ramify-hello==1.2.3"},
		PipIndex: index, Progress: &progress})
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"installing tree with apt-get", "pip: installed ramify-hello-1.2.3", "hello done"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q", want)
		}
	}
	if img.BaseID != base.ID || img.SizeBytes <= 0 {
		t.Errorf("manifest: %+v", img)
	}
	lowers, err := Lowers(dir, "hello")
	if err != nil || len(lowers) != 2 || lowers[1] != base.Rootfs {
		t.Fatalf("Lowers: %v, %v", lowers, err)
	}
	tree := filepath.Join(lowers[0], "usr/bin/tree")
	if uid, gid, _ := owner(t, tree); uid != DefaultHostID || gid != DefaultHostID {
		t.Errorf("tree owned by %d:%d, want the sandboxes' root", uid, gid)
	}
	mods, _ := filepath.Glob(filepath.Join(lowers[0], "usr/local/lib/python3*/dist-packages/ramify_hello.py"))
	if len(mods) != 1 {
		t.Errorf("the pip module is not in the layer: %v", mods)
	}
	if _, err := os.Lstat(filepath.Join(base.Rootfs, "usr/bin/tree")); err == nil {
		t.Error("the build changed the default image")
	}
	if debs, _ := filepath.Glob(filepath.Join(lowers[0], "var/cache/apt/archives/*.deb")); len(debs) > 0 {
		t.Errorf("downloaded packages left in the layer: %v", debs)
	}
	// The layered tree works: python3 of the default image imports the module from the layer.
	out, err := exec.CommandContext(ctx, "unshare", "--mount", "sh", "-c",
		"mount -t overlay overlay -o lowerdir="+lowers[0]+":"+lowers[1]+" /mnt && chroot /mnt python3 -c 'import ramify_hello; print(ramify_hello.hello())' && chroot /mnt tree -L 1 /").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "hello from a wheel") {
		t.Errorf("the image does not work: %v\n%s", err, out)
	}
	list, err := ListNamed(dir)
	if err != nil || len(list) != 1 || list[0].Name != "hello" {
		t.Errorf("ListNamed: %+v, %v", list, err)
	}
	if err := RemoveNamed(ctx, dir, "hello"); err != nil {
		t.Fatal(err)
	}
	if _, err := Lowers(dir, "hello"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("after remove: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, namedDir)); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}

// Lowers refuses a named image built on a default image that has been rebuilt since, and an unknown one.
func TestLowersBaseRebuilt(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "default", "rootfs"), 0o755)
	os.WriteFile(filepath.Join(dir, "default", manifestName), []byte(`{"id": "new"}`), 0o644)
	os.MkdirAll(filepath.Join(dir, namedDir, "x", layerName), 0o755)
	os.WriteFile(filepath.Join(dir, namedDir, "x", manifestName), []byte(`{"name": "x", "base_id": "old"}`), 0o644)
	if _, err := Lowers(dir, "x"); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "build \"x\" again") {
		t.Errorf("rebuilt base: %v", err)
	}
	if _, err := Lowers(dir, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown: %v", err)
	}
	if l, err := Lowers(dir, ""); err != nil || len(l) != 1 {
		t.Errorf("default: %v, %v", l, err)
	}
	os.WriteFile(filepath.Join(dir, namedDir, "x", manifestName), []byte(`{"name": "x", "base_id": "new"}`), 0o644)
	if l, err := Lowers(dir, "x"); err != nil || len(l) != 2 {
		t.Errorf("matching base: %v, %v", l, err)
	}
}

// What runs in a build cannot reach the host's files: its root is the image (pivot_root, the host's tree
// unmounted), and it is container root, not host root.
func TestInRootConfined(t *testing.T) {
	needRoot(t)
	dir := testserver.ImageDir(t)
	base, m, err := load(dir)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "confine")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeTree(tmp) })
	marker := filepath.Join(dir, "host-marker")
	os.WriteFile(marker, []byte("host"), 0o644)
	var out strings.Builder
	o := NamedOptions{Logger: slog.New(slog.DiscardHandler)}
	rep := newReporter(&out, o.Logger)
	layer, work, merged := filepath.Join(tmp, "l"), filepath.Join(tmp, "w"), filepath.Join(tmp, "m")
	for _, d := range []string{layer, work, merged} {
		os.Mkdir(d, 0o755)
	}
	if err := mountOverlayAt(base.Rootfs, layer, work, merged); err != nil {
		t.Fatal(err)
	}
	defer unmountQuiet(o, merged)
	ctx := context.Background()
	// The chroot escape (chroot into a subdirectory, climb out with ..) finds the image's root, not the host's.
	code := `import os, sys
os.chroot("/tmp"); os.chdir("../../../../../../../.."); os.chroot(".")
print("escaped" if os.path.exists(` + "\"" + marker + "\"" + `) else "confined", os.getuid())`
	if err := inRoot(ctx, rep, ids{m.HostUID, m.HostGID}, merged, "python3", "-c", code); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	tail := strings.Join(rep.lastLines(), "\n")
	if !strings.Contains(tail, "confined 0") {
		t.Errorf("inside the build: %q", tail)
	}
}

// A build killed half-way (its overlay still mounted) is cleaned up by the next removal or build.
func TestStaleNamedBuildRemoved(t *testing.T) {
	needRoot(t)
	dir := testserver.ImageDir(t)
	base, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, namedDir, namedTmp+"x-123")
	for _, d := range []string{"layer", "work", "merged"} {
		if err := os.MkdirAll(filepath.Join(stale, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := mountOverlayAt(base.Rootfs, filepath.Join(stale, "layer"), filepath.Join(stale, "work"), filepath.Join(stale, "merged")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeTree(stale) })
	os.MkdirAll(filepath.Join(dir, namedDir, "y", layerName), 0o755)
	os.WriteFile(filepath.Join(dir, namedDir, "y", manifestName), []byte(`{"name": "y"}`), 0o644)
	if err := RemoveNamed(context.Background(), dir, "y"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale build left: %v", err)
	}
	if m, _ := mountsUnder(dir); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
}
