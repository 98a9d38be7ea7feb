package layer

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeAll writes path, making its directories.
func writeAll(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func commonGen(t *testing.T, a, b string) (uint64, bool) {
	t.Helper()
	g, ok, err := CommonGeneration(a, b)
	if err != nil {
		t.Fatalf("CommonGeneration(%s, %s): %v", a, b, err)
	}
	return g, ok
}

// changedPaths lists ChangedSince(dir, gen) under upper/ (upper itself as "./"), sorted, directories with a
// trailing slash.
func changedPaths(t *testing.T, dir string, gen uint64) []string {
	t.Helper()
	ch, ok, err := ChangedSince(dir, gen, 1000)
	if err != nil || !ok {
		t.Fatalf("ChangedSince(%s, %d) = ok %v, %v", dir, gen, ok, err)
	}
	var out []string
	for _, c := range ch {
		if c.Path == "upper" {
			out = append(out, "./")
			continue
		}
		if !strings.HasPrefix(c.Path, "upper/") {
			continue
		}
		p := strings.TrimPrefix(c.Path, "upper/")
		if c.Dir {
			p += "/"
		}
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// TestLineage follows the shape of a fork (parent -> staging base -> children, base removed) and of later
// generations, and checks the generation each pair shares and the changes listed since it.
func TestLineage(t *testing.T) {
	d, _ := openBtrfs(t)
	ctx := context.Background()
	p := mustCreate(t, d, "p")
	for i := range 50 {
		writeAll(t, filepath.Join(p, "upper", "data", "d"+string(rune('a'+i%5)), "f"+string(rune('a'+i/5))), "x")
	}
	writeAll(t, filepath.Join(p, "upper", "keep"), "same")
	mustClone(t, d, "p", "base")
	c1 := mustClone(t, d, "base", "c1")
	c2 := mustClone(t, d, "base", "c2")
	if err := d.Remove(ctx, "base"); err != nil {
		t.Fatal(err)
	}
	other := mustCreate(t, d, "other")

	gPC, ok := commonGen(t, p, c1)
	if !ok {
		t.Fatal("parent and child share no history")
	}
	if g, ok := commonGen(t, c1, c2); !ok || g < gPC {
		t.Fatalf("siblings: generation %d ok %v, want >= %d (the parent's snapshot)", g, ok, gPC)
	}
	if g, ok := commonGen(t, p, p); !ok || g != math.MaxUint64 {
		t.Fatalf("a layer with itself: %d %v", g, ok)
	}
	if _, ok := commonGen(t, p, other); ok {
		t.Fatal("layers created separately share history")
	}
	if got := changedPaths(t, c1, gPC); len(got) != 0 {
		t.Fatalf("untouched child lists changes %v", got)
	}
	if got := changedPaths(t, p, gPC); len(got) != 0 {
		t.Fatalf("untouched parent lists changes %v", got)
	}

	// Changes on each side are listed by path: a rewrite, a new nested file, a rename, a deletion (seen as
	// its directory's change), a hard link (both names).
	writeAll(t, filepath.Join(c1, "upper", "data", "da", "fa"), "y")
	writeAll(t, filepath.Join(c1, "upper", "new", "deep", "n"), "n")
	if err := os.Rename(filepath.Join(c1, "upper", "data", "db", "fb"), filepath.Join(c1, "upper", "data", "moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(c1, "upper", "data", "dc", "fc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(c1, "upper", "data", "dd", "fd"), filepath.Join(c1, "upper", "link")); err != nil {
		t.Fatal(err)
	}
	want := []string{"./", "data/", "data/da/fa", "data/db/", "data/dc/", "data/dd/fd", "data/moved", "link", "new/", "new/deep/", "new/deep/n"}
	if got := changedPaths(t, c1, gPC); !slices.Equal(got, want) {
		t.Fatalf("child's changes:\n got %v\nwant %v", got, want)
	}
	writeAll(t, filepath.Join(p, "upper", "data", "de", "fe"), "parent")
	// Buffered writes that neither truncate nor extend: btrfs records them only at writeback.
	f, err := os.OpenFile(filepath.Join(p, "upper", "data", "da", "fb"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("z"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := changedPaths(t, p, gPC); !slices.Equal(got, []string{"data/da/fb", "data/de/fe"}) {
		t.Fatalf("parent's changes %v", got)
	}
	if got := changedPaths(t, c2, gPC); len(got) != 0 {
		t.Fatalf("a sibling lists changes %v", got)
	}

	// Generations: grandchildren of removed layers still find their common history, through the recorded
	// lineage.
	mustClone(t, d, "c1", "base2")
	g1 := mustClone(t, d, "base2", "g1")
	for _, id := range []string{"base2", "c1"} {
		if err := d.Remove(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if g, ok := commonGen(t, g1, c2); !ok || g != gPC && g < gPC {
		t.Fatalf("grandchild and uncle: %d %v, want about %d", g, ok, gPC)
	}
	if g, ok := commonGen(t, g1, p); !ok || g != gPC {
		t.Fatalf("grandchild and grandparent: %d %v, want %d", g, ok, gPC)
	}
	if got := changedPaths(t, g1, gPC); !slices.Contains(got, "new/deep/n") || !slices.Contains(got, "link") {
		t.Fatalf("grandchild's changes since the fork %v miss the child's", got)
	}

	// Beyond the limit, ChangedSince gives up.
	if _, ok, err := ChangedSince(g1, gPC, 2); err != nil || ok {
		t.Fatalf("over the limit: ok %v, %v", ok, err)
	}
}
