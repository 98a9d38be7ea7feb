package fsdiff

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// hostDir is a directory outside every layer standing for the host's /etc: a passwd like the sandbox's own, and
// files no sandbox has.
func hostDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	write(t, d, "passwd", "host secret\n")
	write(t, d, "shadow", "host only\n")
	write(t, d, "sub/deeper", "host only\n")
	return d
}

// escapes is where a symlink in a sandbox's layer may point to reach dir on the host: absolutely, and relatively
// (enough `..` to climb out of any layer, as `ln -s ../../../../../../../..` in the sandbox).
func escapes(dir string) map[string]string {
	return map[string]string{"absolute": dir, "relative": strings.Repeat("../", 40) + strings.TrimPrefix(dir, "/")}
}

func symlink(t *testing.T, target, root, rel string) {
	t.Helper()
	p := filepath.Join(root, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// compareBoth is Compare (through the changes since a common history when a and b have one) and the walk of both
// layers, which must agree.
func compareBoth(t *testing.T, a, b Layers, paths []string) Result {
	t.Helper()
	got, err := Compare(context.Background(), a, b, paths)
	if err != nil {
		t.Fatalf("Compare: %v", err)
	}
	walked, err := walkLayers(a, b, paths)
	if err != nil {
		t.Fatalf("walk: %v", err)
	}
	if !reflect.DeepEqual(got, walked) {
		t.Fatalf("Compare and the walk disagree:\nCompare %+v\n   walk %+v", got, walked)
	}
	return got
}

// forkedUppers are the upper directories of two fork children of one empty layer, as the server makes them.
func forkedUppers(t *testing.T) (string, string) {
	d := openLayers(t)
	ctx := context.Background()
	p, err := d.Create(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(p, "upper"), 0o755)
	var ups []string
	for _, id := range []string{"c1", "c2"} {
		c, err := d.Clone(ctx, "p", id)
		if err != nil {
			t.Fatal(err)
		}
		ups = append(ups, filepath.Join(c, "upper"))
	}
	return ups[0], ups[1]
}

// A symlink that sandbox code plants in its upper layer, in place of a directory the other sandbox has, is that
// sandbox's entry (compared by its target), never followed to the host: the other sandbox's /root/sub/passwd is
// removed, not compared with the host's passwd, and the host's files are not listed.
func TestCompareDoesNotFollowUpperSymlinks(t *testing.T) {
	host := hostDir(t)
	for how, target := range escapes(host) {
		for _, forked := range []bool{false, true} {
			name := how + "/unrelated"
			if forked {
				name = how + "/forked"
			}
			t.Run(name, func(t *testing.T) {
				f := newFixture(t)
				if forked {
					f.a, f.b = forkedUppers(t)
				}
				write(t, f.a, "root/sub/passwd", "x\n")
				symlink(t, target, f.b, "root/sub")
				symlink(t, target, f.b, "hostroot")
				symlink(t, "/", f.b, "root/all")
				a, b := Layers{Upper: f.a, Lower: f.lower}, Layers{Upper: f.b, Lower: f.lower}
				want := Result{Added: []string{"/root/all", "/root/sub"}, Removed: []string{"/root/sub/passwd"}, Modified: []string{}}
				if got := compareBoth(t, a, b, []string{"/root", "/tmp"}); !reflect.DeepEqual(got, want) {
					t.Errorf("b's /root/sub a symlink to the host:\n got %+v\nwant %+v", got, want)
				}
				// Paths at and through b's symlinks: the symlinks themselves, nothing below them.
				want = Result{Added: []string{"/hostroot", "/root/sub"}, Removed: []string{"/root/sub/passwd"}, Modified: []string{}}
				if got := compareBoth(t, a, b, []string{"/root/sub", "/hostroot", "/hostroot/sub"}); !reflect.DeepEqual(got, want) {
					t.Errorf("paths through b's symlinks:\n got %+v\nwant %+v", got, want)
				}
				// The reverse: the symlink is a's.
				want = Result{Added: []string{"/root/sub/passwd"}, Removed: []string{"/root/all", "/root/sub"}, Modified: []string{}}
				if got := compareBoth(t, b, a, []string{"/root"}); !reflect.DeepEqual(got, want) {
					t.Errorf("a's /root/sub a symlink to the host:\n got %+v\nwant %+v", got, want)
				}
			})
		}
	}
}

// A symlink in the image (a lower layer) is not followed either: below it, the image holds nothing.
func TestCompareDoesNotFollowLowerSymlinks(t *testing.T) {
	host := hostDir(t)
	for how, target := range escapes(host) {
		t.Run(how, func(t *testing.T) {
			f := newFixture(t)
			symlink(t, target, f.lower, "lib")
			// a replaced the image's /lib symlink with a directory of its own; b sees the image's symlink.
			write(t, f.a, "lib/passwd", "x\n")
			write(t, f.a, "lib/sub/deeper", "x\n")
			a, b := Layers{Upper: f.a, Lower: f.lower}, Layers{Upper: f.b, Lower: f.lower}
			want := Result{Added: []string{"/lib"}, Removed: []string{"/lib/passwd", "/lib/sub/deeper"}, Modified: []string{}}
			if got := compareBoth(t, a, b, []string{"/lib", "/lib/sub"}); !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v\nwant %+v", got, want)
			}
			// On different images (every image file a candidate), the same.
			over := t.TempDir()
			a.Over = []string{over}
			if got := compareBoth(t, a, b, []string{"/lib"}); !reflect.DeepEqual(got, want) {
				t.Errorf("different images: got %+v\nwant %+v", got, want)
			}
		})
	}
}

// A symlink that replaces an image directory hides the image's files below it, as the overlay does in the
// sandbox: they are removed, not looked for through the symlink.
func TestCompareSymlinkReplacesImageDirectory(t *testing.T) {
	host := hostDir(t)
	for _, forked := range []bool{false, true} {
		t.Run(map[bool]string{false: "unrelated", true: "forked"}[forked], func(t *testing.T) {
			f := newFixture(t)
			if forked {
				f.a, f.b = forkedUppers(t)
			}
			write(t, f.lower, "root/sub/passwd", "image\n")
			write(t, f.lower, "root/sub/other", "image\n")
			symlink(t, host, f.b, "root/sub")
			a, b := Layers{Upper: f.a, Lower: f.lower}, Layers{Upper: f.b, Lower: f.lower}
			want := Result{Added: []string{"/root/sub"}, Removed: []string{"/root/sub/other", "/root/sub/passwd"}, Modified: []string{}}
			if got := compareBoth(t, a, b, []string{"/root"}); !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v\nwant %+v", got, want)
			}
			// Both replaced it with the same symlink: equal.
			symlink(t, host, f.a, "root/sub")
			want = Result{Added: []string{}, Removed: []string{}, Modified: []string{}}
			if got := compareBoth(t, a, b, []string{"/root", "/root/sub"}); !reflect.DeepEqual(got, want) {
				t.Errorf("the same symlink in both: got %+v\nwant %+v", got, want)
			}
		})
	}
}

// A diff's errors reach API clients: they name the sandbox path and the layer, never a host path (the server's
// data directory).
func TestCompareErrorsNameNoHostPath(t *testing.T) {
	f := newFixture(t)
	os.MkdirAll(filepath.Join(f.a, "root/dir"), 0o755)
	sa, _, closeAll, err := openSides(Layers{Upper: f.a, Lower: f.lower}, Layers{Upper: f.b, Lower: f.lower})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	_, errLink := sa.upper.readlink("/root/missing")
	_, errOpen := sa.upper.openRegular("/root/dir") // a file the sandbox replaced with a directory meanwhile
	_, errLayer := Compare(context.Background(), Layers{Upper: filepath.Join(f.a, "gone"), Lower: f.lower}, Layers{Upper: f.b, Lower: f.lower}, []string{"/root"})
	for what, c := range map[string]struct {
		err  error
		want string
	}{
		"readlink": {errLink, "/root/missing (a's writable layer)"},
		"open":     {errOpen, "/root/dir (a's writable layer): no longer a regular file"},
		"layer":    {errLayer, "open a's writable layer"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) || strings.Contains(c.err.Error(), filepath.Dir(f.a)) {
			t.Errorf("%s: error %v, want one naming %q and no host path", what, c.err, c.want)
		}
	}
}
