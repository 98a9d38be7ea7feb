package fsdiff

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// sparse makes the file rel of root size bytes long, holes everywhere but at the offsets of data.
func sparse(t *testing.T, root, rel string, size int64, data map[int64][]byte) {
	t.Helper()
	p := filepath.Join(root, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for off, b := range data {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
}

// Files with holes are compared by their data only: a hole in both is equal unread, data against a hole is
// compared with zeros, so two 64 GiB files take no time whatever their maps of data and holes.
func TestCompareSparseFiles(t *testing.T) {
	const size = 64 << 30
	zeros := make([]byte, 2<<20)
	cases := []struct {
		name string
		a, b map[int64][]byte
		same bool
	}{
		{"holes only", nil, nil, true},
		{"written zeros against a hole", map[int64][]byte{1 << 20: zeros}, nil, true},
		{"written zeros on both sides, elsewhere", map[int64][]byte{1 << 20: zeros, 40 << 30: []byte("x")}, map[int64][]byte{20 << 30: zeros, 40 << 30: []byte("x")}, true},
		{"same data", map[int64][]byte{10 << 30: []byte("hello")}, map[int64][]byte{10 << 30: []byte("hello")}, true},
		{"different data", map[int64][]byte{10 << 30: []byte("hello")}, map[int64][]byte{10 << 30: []byte("hellp")}, false},
		{"data against a hole", map[int64][]byte{10 << 30: []byte("hello")}, nil, false},
		{"last byte", map[int64][]byte{size - 1: []byte("z")}, map[int64][]byte{size - 1: []byte("y")}, false},
		{"last byte against a hole", nil, map[int64][]byte{size - 1: []byte("z")}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			sparse(t, f.a, "root/big", size, c.a)
			sparse(t, f.b, "root/big", size, c.b)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			got, err := Compare(ctx, Layers{Upper: f.a, Lower: f.lower}, Layers{Upper: f.b, Lower: f.lower}, []string{"/root"})
			if err != nil {
				t.Fatalf("after %v: %v", time.Since(start), err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("comparing two 64 GiB sparse files took %v", d)
			}
			want := Result{Added: []string{}, Removed: []string{}, Modified: []string{}}
			if !c.same {
				want.Modified = []string{"/root/big"}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v\nwant %+v", got, want)
			}
		})
	}
}

// A diff reads at most maxContentBytes of file content: then it stops and says it is truncated, with the
// differences of the paths before the file it could not finish. Holes cost nothing.
func TestCompareContentBudget(t *testing.T) {
	defer func(n int64) { maxContentBytes = n }(maxContentBytes)
	maxContentBytes = 3 << 20
	f := newFixture(t)
	data := bytes.Repeat([]byte("data"), 1<<19) // 2 MiB
	write(t, f.b, "root/a0", "added, before")
	sparse(t, f.a, "root/a1", 64<<30, nil) // free: holes
	sparse(t, f.b, "root/a1", 64<<30, nil)
	write(t, f.a, "root/b1", string(data)) // 4 MiB to read in all: past the budget
	write(t, f.b, "root/b1", string(data))
	write(t, f.b, "root/c0", "added, after")
	got, err := Compare(context.Background(), Layers{Upper: f.a, Lower: f.lower}, Layers{Upper: f.b, Lower: f.lower}, []string{"/root"})
	if err != nil {
		t.Fatal(err)
	}
	want := Result{Added: []string{"/root/a0"}, Removed: []string{}, Modified: []string{}, Truncated: true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	maxContentBytes = 4 << 20 // just enough
	got, err = Compare(context.Background(), Layers{Upper: f.a, Lower: f.lower}, Layers{Upper: f.b, Lower: f.lower}, []string{"/root"})
	want = Result{Added: []string{"/root/a0", "/root/c0"}, Removed: []string{}, Modified: []string{}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("within the budget: got %+v, %v\nwant %+v", got, err, want)
	}
}

// endingCtx is a context whose Err is context.Canceled from its n-th call on.
type endingCtx struct {
	context.Context
	n int
}

func (c *endingCtx) Err() error {
	if c.n--; c.n <= 0 {
		return context.Canceled
	}
	return nil
}

// A comparison whose context ends stops: within a file's content (after a few MiB, not at its end), and before
// it starts.
func TestCompareStopsWhenCancelled(t *testing.T) {
	f := newFixture(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 4<<20) // 64 MiB
	write(t, f.a, "root/big", string(data))
	write(t, f.b, "root/big", string(data))
	sa, sb, closeAll, err := openSides(Layers{Upper: f.a, Lower: f.lower}, Layers{Upper: f.b, Lower: f.lower})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	c := &comparison{ctx: &endingCtx{Context: context.Background(), n: 3}, left: maxContentBytes}
	ea, _ := lazyView{sa}.resolve("/root/big")
	eb, _ := lazyView{sb}.resolve("/root/big")
	same, err := sameContent(c, ea, eb)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("sameContent under an ended context: %v, %v", same, err)
	}
	if read := maxContentBytes - c.left; read >= 2*int64(len(data)) || read > 16<<20 {
		t.Errorf("it read %d bytes of the two files' %d before it stopped", read, 2*len(data))
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Compare(ctx, Layers{Upper: f.a, Lower: f.lower}, Layers{Upper: f.b, Lower: f.lower}, []string{"/root"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Compare under a cancelled context: %v", err)
	}
}
