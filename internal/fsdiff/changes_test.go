package fsdiff

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/layer"
)

// openLayers gives a btrfs layer driver on a loop image, unmounted at the end of the test.
func openLayers(t testing.TB) layer.Driver {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("btrfs layers need root")
	}
	dir := t.TempDir()
	d, err := layer.Open(context.Background(), dir, layer.Options{Driver: "btrfs", ImageSize: 1 << 30})
	if err != nil {
		t.Fatalf("open btrfs layers: %v", err)
	}
	t.Cleanup(func() {
		d.Close()
		if err := unix.Unmount(filepath.Join(dir, "layers"), 0); err != nil {
			t.Errorf("unmount layers: %v", err)
		}
	})
	return d
}

// The namespace the random trees draw from: small, so that both sides keep touching the same paths.
var (
	randDirs  = []string{"root", "root/sub", "root/sub/deep", "tmp", "etc", "root/other"}
	randNames = []string{"a", "b", "c", "sub", "deep"}
)

func randPath(rng *rand.Rand) string {
	return filepath.Join(randDirs[rng.IntN(len(randDirs))], randNames[rng.IntN(len(randNames))])
}

// mutate applies one random change to the tree at root (an upper layer or the image), the kind a sandbox makes:
// writes (some keeping size and mtime), deletions, whiteouts, opaque directories, renames, links, symlinks,
// mode changes. Failures (a parent that is a file, say) just mean the step does nothing.
func mutate(rng *rand.Rand, root string, upper bool) {
	rel := randPath(rng)
	p := filepath.Join(root, rel)
	ops := 9
	if !upper {
		ops = 3 // the image has no whiteouts or opaque directories
	}
	switch rng.IntN(ops) {
	case 0, 1:
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(fmt.Sprintf("content %d", rng.IntN(4))), 0o644)
	case 2:
		// Same size, same mtime, different content: only a content comparison sees it. Written in place (no
		// truncation), or appended to: btrfs records those only at writeback.
		if st, err := os.Lstat(p); err == nil && st.Mode().IsRegular() {
			if f, err := os.OpenFile(p, os.O_WRONLY, 0); err == nil {
				if rng.IntN(2) == 0 {
					f.WriteAt([]byte{byte('a' + rng.IntN(26))}, 0)
				} else {
					f.WriteAt([]byte("+"), st.Size())
				}
				f.Close()
				os.Chtimes(p, st.ModTime(), st.ModTime())
			}
		}
	case 3:
		os.RemoveAll(p)
	case 4:
		os.RemoveAll(p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		unix.Mknod(p, unix.S_IFCHR, 0)
	case 5:
		os.RemoveAll(p)
		os.MkdirAll(p, 0o755)
		unix.Lsetxattr(p, "trusted.overlay.opaque", []byte("y"), 0)
		if rng.IntN(2) == 0 {
			os.WriteFile(filepath.Join(p, "a"), []byte("in opaque"), 0o644)
		}
	case 6:
		q := filepath.Join(root, randPath(rng))
		os.MkdirAll(filepath.Dir(q), 0o755)
		os.Rename(p, q)
	case 7:
		q := filepath.Join(root, randPath(rng))
		os.MkdirAll(filepath.Dir(q), 0o755)
		os.Link(p, q)
	case 8:
		os.RemoveAll(p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if rng.IntN(2) == 0 {
			os.Symlink(fmt.Sprintf("target%d", rng.IntN(2)), p)
		} else {
			os.Chmod(filepath.Dir(p), 0o700)
		}
	}
}

// TestCompareChangesMatchesWalk checks the change-based comparison against the walk, on random layers that share
// history the way fork makes them (parent -> staging snapshot -> children, then grandchildren), after every round
// of random changes on every side, for several path sets.
func TestCompareChangesMatchesWalk(t *testing.T) {
	d := openLayers(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	lower := t.TempDir()
	for range 30 {
		mutate(rng, lower, false)
	}
	mk := func(id string) {
		p, err := d.Create(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		os.Mkdir(filepath.Join(p, "upper"), 0o755)
		os.Mkdir(filepath.Join(p, "work"), 0o755)
	}
	clone := func(src, dst string) {
		if _, err := d.Clone(ctx, src, dst); err != nil {
			t.Fatal(err)
		}
	}
	layers := func(id string) Layers { return Layers{Upper: filepath.Join(d.Path(id), "upper"), Lower: lower} }
	mk("p")
	for range 30 {
		mutate(rng, layers("p").Upper, true)
	}
	clone("p", "base")
	clone("base", "c1")
	clone("base", "c2")
	d.Remove(ctx, "base")
	ids := []string{"p", "c1", "c2"}
	pathSets := [][]string{{"/"}, {"/root", "/tmp"}, {"/root/sub"}, {"/root/sub/deep/a"}, {"/etc/b", "/nonexistent"}}

	check := func(round int) {
		t.Helper()
		for _, x := range ids {
			for _, y := range ids {
				for _, paths := range pathSets {
					want, err := walkLayers(layers(x), layers(y), paths)
					if err != nil {
						t.Fatal(err)
					}
					if oracle := oracleDiff(layers(x), layers(y), paths); !reflect.DeepEqual(want, oracle) {
						t.Fatalf("round %d: %s vs %s under %v:\n  walk %+v\noracle %+v\n%s\n%s\nlower:\n%s", round, x, y, paths, want, oracle,
							listTree(layers(x).Upper), listTree(layers(y).Upper), listTree(lower))
					}
					got, ok, err := changesLayers(layers(x), layers(y), paths)
					if err != nil || !ok {
						t.Fatalf("round %d: compareChanges(%s, %s) ok %v err %v", round, x, y, ok, err)
					}
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("round %d: %s vs %s under %v:\nchanges %+v\n   walk %+v\n%s\n%s\nlower:\n%s", round, x, y, paths, got, want,
							listTree(layers(x).Upper), listTree(layers(y).Upper), listTree(lower))
					}
				}
			}
		}
	}
	check(0)
	for round := 1; round <= 40; round++ {
		for _, id := range ids {
			for range rng.IntN(4) {
				mutate(rng, layers(id).Upper, true)
			}
		}
		if round == 20 {
			// A new generation: c1 forks again (through a staging snapshot that is removed), and its child takes
			// c1's place in the comparisons.
			clone("c1", "base2")
			clone("base2", "g1")
			d.Remove(ctx, "base2")
			ids = append(ids, "g1")
		}
		check(round)
	}
}

// merged is what a sandbox sees below rel, computed the slow, obvious way from the overlay's rules: every
// non-directory path with its type and content.
func merged(l Layers, rel string, upperDir, lowerDir bool, out map[string]string) {
	names := map[string]bool{}
	up, lo := filepath.Join(l.Upper, rel), filepath.Join(l.Lower, rel)
	if upperDir {
		ents, _ := os.ReadDir(up)
		for _, e := range ents {
			names[e.Name()] = true
		}
		if isOpaque(up) {
			lowerDir = false
		}
	}
	if lowerDir {
		ents, _ := os.ReadDir(lo)
		for _, e := range ents {
			names[e.Name()] = true
		}
	}
	describe := func(p string, st *unix.Stat_t) string {
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, _ := os.ReadFile(p)
			return "file:" + string(b)
		case unix.S_IFLNK:
			t, _ := os.Readlink(p)
			return "link:" + t
		}
		return fmt.Sprintf("other:%o:%d", st.Mode&unix.S_IFMT, st.Rdev)
	}
	for n := range names {
		child := filepath.Join(rel, n)
		var su, sl *unix.Stat_t
		if upperDir {
			su, _ = lstat(filepath.Join(l.Upper, child))
		}
		if lowerDir {
			sl, _ = lstat(filepath.Join(l.Lower, child))
		}
		switch {
		case su != nil && isWhiteout(su):
		case su != nil && isDir(su):
			merged(l, child, true, sl != nil && isDir(sl), out)
		case su != nil:
			out[child] = describe(filepath.Join(l.Upper, child), su)
		case sl != nil && isDir(sl):
			merged(l, child, false, true, out)
		case sl != nil:
			out[child] = describe(filepath.Join(l.Lower, child), sl)
		}
	}
}

// oracleDiff compares the two merged views under paths.
func oracleDiff(a, b Layers, paths []string) Result {
	ma, mb := map[string]string{}, map[string]string{}
	merged(a, "/", true, true, ma)
	merged(b, "/", true, true, mb)
	in := func(p string) bool {
		for _, q := range paths {
			if p == q || within(p, q) {
				return true
			}
		}
		return false
	}
	res := Result{Added: []string{}, Removed: []string{}, Modified: []string{}}
	all := map[string]bool{}
	for p := range ma {
		all[p] = true
	}
	for p := range mb {
		all[p] = true
	}
	for _, p := range sortedNames(all) {
		va, okA := ma[p]
		vb, okB := mb[p]
		switch {
		case !in(p):
		case !okA && okB:
			res.Added = append(res.Added, p)
		case okA && !okB:
			res.Removed = append(res.Removed, p)
		case okA && okB && va != vb:
			res.Modified = append(res.Modified, p)
		}
	}
	return res
}

// listTree describes every entry under root, for failure messages.
func listTree(root string) string {
	var out string
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			var st unix.Stat_t
			unix.Lstat(p, &st)
			out += fmt.Sprintf("  %s %v ino=%d opaque=%v\n", p, fi.Mode(), st.Ino, isOpaque(p))
		}
		return nil
	})
	return out
}

// TestCompareChangesNeedsSharedHistory: layers created separately, or not on btrfs, are compared by walking.
func TestCompareChangesNeedsSharedHistory(t *testing.T) {
	d := openLayers(t)
	ctx := context.Background()
	lower := t.TempDir()
	var ls []Layers
	for _, id := range []string{"x", "y"} {
		p, err := d.Create(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		write(t, p, "upper/root/f", "same")
		ls = append(ls, Layers{Upper: filepath.Join(p, "upper"), Lower: lower})
	}
	if _, ok, err := changesLayers(ls[0], ls[1], []string{"/"}); ok || err != nil {
		t.Fatalf("unrelated layers: ok %v, %v", ok, err)
	}
	f := newFixture(t)
	if _, ok, err := changesLayers(Layers{Upper: f.a, Lower: f.lower}, Layers{Upper: f.b, Lower: f.lower}, []string{"/"}); ok || err != nil {
		t.Fatalf("plain directories: ok %v, %v", ok, err)
	}
	res, err := Compare(ctx, ls[0], ls[1], []string{"/root"})
	if err != nil || len(res.Added)+len(res.Removed)+len(res.Modified) != 0 {
		t.Fatalf("Compare of equal unrelated layers: %+v, %v", res, err)
	}
}
