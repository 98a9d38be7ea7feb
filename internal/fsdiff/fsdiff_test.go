package fsdiff

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

type fixture struct{ lower, a, b string }

func newFixture(t *testing.T) fixture {
	d := t.TempDir()
	f := fixture{filepath.Join(d, "lower"), filepath.Join(d, "a"), filepath.Join(d, "b")}
	for _, p := range []string{f.lower, f.a, f.b} {
		os.MkdirAll(p, 0o755)
	}
	return f
}

func write(t *testing.T, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func whiteout(t *testing.T, root, rel string) {
	t.Helper()
	p := filepath.Join(root, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := unix.Mknod(p, unix.S_IFCHR|0o000, 0); err != nil {
		t.Skipf("mknod whiteout needs root: %v", err)
	}
}

func opaque(t *testing.T, root, rel string) {
	t.Helper()
	p := filepath.Join(root, rel)
	os.MkdirAll(p, 0o755)
	if err := unix.Lsetxattr(p, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Skipf("trusted xattr needs root: %v", err)
	}
}

func TestCompare(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, f fixture)
		paths []string
		want  Result
	}{
		{"reference example", func(t *testing.T, f fixture) {
			write(t, f.a, "root/a.txt", "from a")
			write(t, f.b, "root/b.txt", "from b")
		}, []string{"/root", "/tmp"}, Result{Added: []string{"/root/b.txt"}, Removed: []string{"/root/a.txt"}, Modified: []string{}}},
		{"same size content change", func(t *testing.T, f fixture) {
			write(t, f.a, "root/x", "aaaa")
			write(t, f.b, "root/x", "bbbb")
			now := time.Now()
			os.Chtimes(filepath.Join(f.a, "root/x"), now, now)
			os.Chtimes(filepath.Join(f.b, "root/x"), now, now)
		}, []string{"/root"}, Result{Added: []string{}, Removed: []string{}, Modified: []string{"/root/x"}}},
		{"identical content in both uppers", func(t *testing.T, f fixture) {
			write(t, f.a, "root/same", "same")
			write(t, f.b, "root/same", "same")
		}, []string{"/root"}, Result{Added: []string{}, Removed: []string{}, Modified: []string{}}},
		{"deleted image file via whiteout", func(t *testing.T, f fixture) {
			write(t, f.lower, "etc/conf", "image")
			whiteout(t, f.b, "etc/conf")
		}, []string{"/etc"}, Result{Added: []string{}, Removed: []string{"/etc/conf"}, Modified: []string{}}},
		{"deleted then recreated", func(t *testing.T, f fixture) {
			write(t, f.lower, "etc/conf", "image")
			write(t, f.b, "etc/conf", "image") // recreated with the same content: equal
			write(t, f.a, "etc/other", "x")
			whiteout(t, f.b, "etc/other")
		}, []string{"/etc"}, Result{Added: []string{}, Removed: []string{"/etc/other"}, Modified: []string{}}},
		{"opaque directory hides the image", func(t *testing.T, f fixture) {
			write(t, f.lower, "srv/data/1", "one")
			write(t, f.lower, "srv/data/sub/2", "two")
			opaque(t, f.a, "srv/data")
			write(t, f.a, "srv/data/new", "n")
		}, []string{"/srv"}, Result{Added: []string{"/srv/data/1", "/srv/data/sub/2"}, Removed: []string{"/srv/data/new"}, Modified: []string{}}},
		{"whited-out directory", func(t *testing.T, f fixture) {
			write(t, f.lower, "opt/tool/bin", "x")
			whiteout(t, f.a, "opt/tool")
		}, []string{"/opt"}, Result{Added: []string{"/opt/tool/bin"}, Removed: []string{}, Modified: []string{}}},
		{"nested directories and paths filter", func(t *testing.T, f fixture) {
			write(t, f.b, "root/a/b/c/deep.txt", "d")
			write(t, f.b, "var/log/x", "outside paths")
		}, []string{"/root"}, Result{Added: []string{"/root/a/b/c/deep.txt"}, Removed: []string{}, Modified: []string{}}},
		{"symlink target change", func(t *testing.T, f fixture) {
			os.MkdirAll(filepath.Join(f.a, "root"), 0o755)
			os.MkdirAll(filepath.Join(f.b, "root"), 0o755)
			os.Symlink("/x", filepath.Join(f.a, "root/l"))
			os.Symlink("/y", filepath.Join(f.b, "root/l"))
		}, []string{"/root"}, Result{Added: []string{}, Removed: []string{}, Modified: []string{"/root/l"}}},
		{"upper file over image file", func(t *testing.T, f fixture) {
			write(t, f.lower, "etc/motd", "image")
			write(t, f.a, "etc/motd", "changed")
		}, []string{"/etc"}, Result{Added: []string{}, Removed: []string{}, Modified: []string{"/etc/motd"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			c.setup(t, f)
			got, err := Compare(context.Background(), Layers{Upper: f.a, Lower: f.lower}, Layers{Upper: f.b, Lower: f.lower}, c.paths)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// BenchmarkCompareUnchanged compares two fork children of a layer holding 10,000 files that neither changed:
// through the changes since their common history (what the server does), and by walking both layers and
// comparing contents (what it falls back to for sandboxes without one).
func BenchmarkCompareUnchanged(b *testing.B) {
	d := openLayers(b)
	ctx := context.Background()
	lower := b.TempDir()
	p, err := d.Create(ctx, "p")
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 10000; i++ {
		f := filepath.Join(p, "upper", "root", "d"+string(rune('a'+i%20)), "f"+itoa(i))
		os.MkdirAll(filepath.Dir(f), 0o755)
		os.WriteFile(f, []byte("content "+itoa(i)), 0o644)
	}
	for _, id := range []string{"c1", "c2"} {
		if _, err := d.Clone(ctx, "p", id); err != nil {
			b.Fatal(err)
		}
	}
	la := Layers{Upper: filepath.Join(d.Path("c1"), "upper"), Lower: lower}
	lb := Layers{Upper: filepath.Join(d.Path("c2"), "upper"), Lower: lower}
	for _, c := range []struct {
		name string
		fn   func(a, b Layers, paths []string) (Result, error)
	}{{"changes", func(a, b Layers, paths []string) (Result, error) { return Compare(ctx, a, b, paths) }}, {"walk", walkLayers}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				r, err := c.fn(la, lb, []string{"/root", "/tmp"})
				if err != nil || len(r.Modified)+len(r.Added)+len(r.Removed) != 0 {
					b.Fatal(err, r)
				}
			}
		})
	}
}

func itoa(i int) string { return string([]byte(fmtInt(i))) }

func fmtInt(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for i > 0 {
		b = append([]byte{byte('0' + i%10)}, b...)
		i /= 10
	}
	return string(b)
}

// TestCompareNamedImage compares a sandbox on a named image (its own layer above the default image, with a
// deleted file, a new one and an opaque directory) with one on the default image, and with a sibling on the
// same image.
func TestCompareNamedImage(t *testing.T) {
	f := newFixture(t)
	over := filepath.Join(filepath.Dir(f.lower), "over")
	write(t, f.lower, "etc/a", "a")
	write(t, f.lower, "etc/b", "b")
	write(t, f.lower, "d/x", "x")
	write(t, f.lower, "etc/m", "lower")
	whiteout(t, over, "etc/a")
	write(t, over, "etc/c", "c")
	write(t, over, "etc/m", "over")
	opaque(t, over, "d")
	write(t, over, "d/y", "y")
	named := Layers{Upper: f.a, Lower: f.lower, Over: []string{over}}
	plain := Layers{Upper: f.b, Lower: f.lower}
	got, err := Compare(context.Background(), named, plain, []string{"/"})
	if err != nil {
		t.Fatal(err)
	}
	want := Result{Added: []string{"/d/x", "/etc/a"}, Removed: []string{"/d/y", "/etc/c"}, Modified: []string{"/etc/m"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("named vs default image:\n got %+v\nwant %+v", got, want)
	}
	// Siblings on the same image: only their own changes.
	write(t, f.b, "etc/c", "changed")
	got, err = Compare(context.Background(), named, Layers{Upper: f.b, Lower: f.lower, Over: []string{over}}, []string{"/etc"})
	if err != nil {
		t.Fatal(err)
	}
	want = Result{Added: []string{}, Removed: []string{}, Modified: []string{"/etc/c"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("same image:\n got %+v\nwant %+v", got, want)
	}
}

// lstat is what a host path holds, not followed (nil when nothing), for the tests' fixtures and oracles.
func lstat(p string) (*unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return nil, nil
		}
		return nil, err
	}
	return &st, nil
}

// isOpaque reports whether the host directory p is an opaque overlay directory.
func isOpaque(p string) bool {
	buf := make([]byte, 4)
	n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

// walkLayers is compareWalk on a and b opened as Compare opens them.
func walkLayers(a, b Layers, paths []string) (Result, error) {
	sa, sb, closeAll, err := openSides(a, b)
	if err != nil {
		return Result{}, err
	}
	defer closeAll()
	return compareWalk(&comparison{ctx: context.Background(), left: maxContentBytes}, sa, sb, paths)
}

// changesLayers is compareChanges on a and b opened as Compare opens them.
func changesLayers(a, b Layers, paths []string) (Result, bool, error) {
	sa, sb, closeAll, err := openSides(a, b)
	if err != nil {
		return Result{}, false, err
	}
	defer closeAll()
	return compareChanges(&comparison{ctx: context.Background(), left: maxContentBytes}, sa, sb, paths)
}
