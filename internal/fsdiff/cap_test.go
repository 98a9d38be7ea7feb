package fsdiff

import (
	"context"
	"reflect"
	"testing"
)

// A diff stops when a list reaches maxEntries and says so; the lists then hold the differences of the paths
// before that point, in order.
func TestCompareCap(t *testing.T) {
	defer func(n int) { maxEntries = n }(maxEntries)
	maxEntries = 3
	f := newFixture(t)
	for _, n := range []string{"a1", "a2", "a3", "a4", "a5"} {
		write(t, f.b, "root/"+n, n)
	}
	write(t, f.a, "root/b0", "removed, sorts before the cut")
	write(t, f.a, "root/zz", "removed, sorts after the cut")
	res, err := Compare(context.Background(), Layers{Upper: f.a, Lower: f.lower}, Layers{Upper: f.b, Lower: f.lower}, []string{"/root"})
	if err != nil {
		t.Fatal(err)
	}
	want := Result{Added: []string{"/root/a1", "/root/a2", "/root/a3"}, Removed: []string{}, Modified: []string{}, Truncated: true}
	if !reflect.DeepEqual(res, want) {
		t.Fatalf("got %+v\nwant %+v", res, want)
	}

	// Exactly maxEntries differences: complete, not truncated.
	g := newFixture(t)
	for _, n := range []string{"a1", "a2", "a3"} {
		write(t, g.b, "root/"+n, n)
	}
	res, err = Compare(context.Background(), Layers{Upper: g.a, Lower: g.lower}, Layers{Upper: g.b, Lower: g.lower}, []string{"/root"})
	if err != nil || res.Truncated || len(res.Added) != 3 {
		t.Fatalf("three differences: %+v, %v", res, err)
	}
}
