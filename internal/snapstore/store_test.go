package snapstore

import (
	"github.com/ramify-dev/ramify/internal/s3test"

	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// leftovers is implemented by both stores: the temporary objects of unfinished Puts.
type leftovers interface {
	tmpObjects(ctx context.Context) ([]string, error)
}

// randReader returns n deterministic pseudo-random bytes without holding them.
func randReader(seed uint64, n int64) io.Reader {
	var s [32]byte
	s[0], s[1] = byte(seed), byte(seed>>8)
	return io.LimitReader(rand.NewChaCha8(s), n)
}

func randBytes(seed uint64, n int) []byte {
	b, _ := io.ReadAll(randReader(seed, int64(n)))
	return b
}

// hexCRC is the CRC-32C of b, as Sum.CRC32C holds it, computed here bit by bit (not with hash/crc32, as the store).
func hexCRC(b []byte) string {
	c := ^uint32(0)
	for _, x := range b {
		c ^= uint32(x)
		for range 8 {
			c = c>>1 ^ 0x82f63b78&-(c&1)
		}
	}
	return fmt.Sprintf("%08x", ^c)
}

// hashingReader hashes what the store consumes: the expected checksum, computed independently of the store.
type hashingReader struct {
	r io.Reader
	h interface {
		io.Writer
		Sum([]byte) []byte
	}
	n int64
}

func (h *hashingReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	h.n += int64(n)
	return n, err
}

// failingReader yields n bytes, then fails.
type failingReader struct {
	r io.Reader
	n int64
}

var errBoom = errors.New("boom: reader failed midway")

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errBoom
	}
	if int64(len(p)) > f.n {
		p = p[:f.n]
	}
	n, err := f.r.Read(p)
	f.n -= int64(n)
	return n, err
}

// heapPeak samples the heap while fn runs and returns the peak growth over the live heap before it.
func heapPeak(fn func()) uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapAlloc)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	fn()
	close(stop)
	wg.Wait()
	if peak < base {
		return 0
	}
	return peak - base
}

// heapLimit is the allowed heap growth while streaming a big object: a few buffers, and for S3 the parts in
// flight plus the HTTP client's own.
func heapLimit(s Store) uint64 {
	if strings.HasPrefix(s.Name(), "s3://") {
		return (s3Parallel + 1) * s3PartSize
	}
	return 16 << 20
}

// sumOK reports whether got is what Stat or List may report for an object whose CRC-32C is want: want itself,
// or nothing for S3, which keeps no checksum of objects it cannot label at creation.
func sumOK(s Store, got, want string) bool {
	return got == want || got == "" && strings.HasPrefix(s.Name(), "s3://")
}

func put(t *testing.T, s Store, key string, data []byte) Object {
	t.Helper()
	o, err := s.Put(context.Background(), key, bytes.NewReader(data))
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	if o.Key != key || o.Size != int64(len(data)) || o.CRC32C != hexCRC(data) {
		t.Fatalf("put %s returned %+v, want size %d sha %s", key, o, len(data), hexCRC(data))
	}
	return o
}

func get(t *testing.T, s Store, key string) []byte {
	t.Helper()
	rc, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return b
}

func keys(objs []Object) []string {
	out := []string{}
	for _, o := range objs {
		out = append(out, o.Key)
	}
	return out
}

func noLeftovers(t *testing.T, s Store) {
	t.Helper()
	if l, ok := s.(leftovers); ok {
		left, err := l.tmpObjects(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(left) > 0 {
			t.Errorf("temporary objects left behind: %v", left)
		}
	}
}

const bigObject = 200 << 20

// runStoreSuite is the conformance suite every Store passes.
func runStoreSuite(t *testing.T, newStore func(t *testing.T) Store) {
	ctx := context.Background()

	t.Run("RoundTrip", func(t *testing.T) {
		s := newStore(t)
		data := []byte("hello, snapshot")
		put(t, s, "sandboxes/sb1/upper.tar", data)
		if got := get(t, s, "sandboxes/sb1/upper.tar"); !bytes.Equal(got, data) {
			t.Fatalf("got %q", got)
		}
		o, err := s.Stat(ctx, "sandboxes/sb1/upper.tar")
		if err != nil || o.Size != int64(len(data)) || !sumOK(s, o.CRC32C, hexCRC(data)) || o.Key != "sandboxes/sb1/upper.tar" {
			t.Fatalf("stat = %+v, %v", o, err)
		}
		put(t, s, "empty", nil)
		if got := get(t, s, "empty"); len(got) != 0 {
			t.Fatalf("empty object read back %d bytes", len(got))
		}
		// A long key of the maximum length class.
		long := strings.Repeat(strings.Repeat("k", 200)+"/", 5) + "end"
		put(t, s, long, []byte("long"))
		if got := get(t, s, long); string(got) != "long" {
			t.Fatalf("long key: %q", got)
		}
		noLeftovers(t, s)
	})

	t.Run("BigStreamed", func(t *testing.T) {
		s := newStore(t)
		hr := &hashingReader{r: randReader(7, bigObject), h: crc32.New(crc32.MakeTable(crc32.Castagnoli))}
		var o Object
		var err error
		start := time.Now()
		peak := heapPeak(func() { o, err = s.Put(ctx, "big/object", hr) })
		putDur := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		want := hex.EncodeToString(hr.h.Sum(nil))
		if o.Size != bigObject || hr.n != bigObject || o.CRC32C != want {
			t.Fatalf("put = %+v, want size %d sha %s", o, bigObject, want)
		}
		if peak > heapLimit(s) {
			t.Errorf("put: peak heap growth %d MB for a %d MB object, want <= %d MB", peak>>20, bigObject>>20, heapLimit(s)>>20)
		}
		h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
		var n int64
		start = time.Now()
		gpeak := heapPeak(func() {
			var rc io.ReadCloser
			if rc, err = s.Get(ctx, "big/object"); err != nil {
				return
			}
			defer rc.Close()
			n, err = io.Copy(h, rc)
		})
		getDur := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if n != bigObject || hex.EncodeToString(h.Sum(nil)) != want {
			t.Fatalf("get: %d bytes, sha %x, want %d, %s", n, h.Sum(nil), bigObject, want)
		}
		if gpeak > heapLimit(s) {
			t.Errorf("get: peak heap growth %d MB, want <= %d MB", gpeak>>20, heapLimit(s)>>20)
		}
		st, err := s.Stat(ctx, "big/object")
		if err != nil || st.Size != bigObject || !sumOK(s, st.CRC32C, want) {
			t.Fatalf("stat = %+v, %v", st, err)
		}
		t.Logf("%s: %d MB put in %v (heap +%d MB), get in %v (heap +%d MB)", s.Name(), bigObject>>20,
			putDur.Round(time.Millisecond), peak>>20, getDur.Round(time.Millisecond), gpeak>>20)
		noLeftovers(t, s)
	})

	t.Run("NotFound", func(t *testing.T) {
		s := newStore(t)
		put(t, s, "present/x", []byte("x"))
		for _, k := range []string{"missing", "present", "present/x/y", "present/y"} {
			if _, err := s.Get(ctx, k); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("get %s: %v, want ErrNotFound", k, err)
			}
			if _, err := s.Stat(ctx, k); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("stat %s: %v, want ErrNotFound", k, err)
			}
			if err := s.Copy(ctx, k, "dst"); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("copy %s: %v, want ErrNotFound", k, err)
			}
		}
	})

	t.Run("Overwrite", func(t *testing.T) {
		s := newStore(t)
		put(t, s, "k", []byte("first version, longer"))
		put(t, s, "k", []byte("second"))
		if got := get(t, s, "k"); string(got) != "second" {
			t.Fatalf("got %q", got)
		}
		o, err := s.Stat(ctx, "k")
		if err != nil || o.Size != 6 || !sumOK(s, o.CRC32C, hexCRC([]byte("second"))) {
			t.Fatalf("stat = %+v, %v", o, err)
		}
	})

	t.Run("Copy", func(t *testing.T) {
		s := newStore(t)
		data := randBytes(3, 3<<20+17)
		put(t, s, "snap/a/upper.tar", data)
		if err := s.Copy(ctx, "snap/a/upper.tar", "snap/b/upper.tar"); err != nil {
			t.Fatal(err)
		}
		if got := get(t, s, "snap/b/upper.tar"); !bytes.Equal(got, data) {
			t.Fatal("copy is not byte-identical")
		}
		o, err := s.Stat(ctx, "snap/b/upper.tar")
		if err != nil || o.Size != int64(len(data)) || !sumOK(s, o.CRC32C, hexCRC(data)) {
			t.Fatalf("stat copy = %+v, %v", o, err)
		}
		// Copy over an existing object, and the source stays.
		put(t, s, "snap/c", []byte("old"))
		if err := s.Copy(ctx, "snap/a/upper.tar", "snap/c"); err != nil {
			t.Fatal(err)
		}
		if got := get(t, s, "snap/c"); !bytes.Equal(got, data) {
			t.Fatal("copy over an existing object is not byte-identical")
		}
		if got := get(t, s, "snap/a/upper.tar"); !bytes.Equal(got, data) {
			t.Fatal("copy changed its source")
		}
		// A copy and its source go their own ways: the source replaced, then deleted, the copy stays as it was.
		put(t, s, "snap/a/upper.tar", []byte("replaced"))
		if got := get(t, s, "snap/b/upper.tar"); !bytes.Equal(got, data) {
			t.Fatal("replacing the source changed its copy")
		}
		if err := s.Delete(ctx, "snap/a/"); err != nil {
			t.Fatal(err)
		}
		if got := get(t, s, "snap/b/upper.tar"); !bytes.Equal(got, data) {
			t.Fatal("deleting the source changed its copy")
		}
		if o, err := s.Stat(ctx, "snap/b/upper.tar"); err != nil || !sumOK(s, o.CRC32C, hexCRC(data)) {
			t.Fatalf("stat copy after its source went = %+v, %v", o, err)
		}
		noLeftovers(t, s)
	})

	t.Run("ListAndDelete", func(t *testing.T) {
		s := newStore(t)
		all := []string{"snap/1/a", "snap/1/b", "snap/10/c", "snap/2/a", "zz"}
		for i, k := range all {
			put(t, s, k, bytes.Repeat([]byte{'x'}, i+1))
		}
		check := func(prefix string, want ...string) {
			t.Helper()
			objs, err := s.List(ctx, prefix)
			if err != nil {
				t.Fatalf("list %q: %v", prefix, err)
			}
			if want == nil {
				want = []string{}
			}
			if got := keys(objs); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("list %q = %v, want %v", prefix, got, want)
			}
			for _, o := range objs {
				if o.Size < 1 || len(o.CRC32C) != 8 && !sumOK(s, o.CRC32C, "(none)") {
					t.Fatalf("list %q: %+v", prefix, o)
				}
			}
		}
		check("", all...)
		check("snap/", "snap/1/a", "snap/1/b", "snap/10/c", "snap/2/a")
		check("snap/1", "snap/1/a", "snap/1/b", "snap/10/c")
		check("snap/1/", "snap/1/a", "snap/1/b")
		check("nothing/")
		check("snap/1/a/")
		objs, _ := s.List(ctx, "zz")
		if len(objs) != 1 || objs[0].Size != 5 || !sumOK(s, objs[0].CRC32C, hexCRC([]byte("xxxxx"))) {
			t.Fatalf("list zz = %+v", objs)
		}
		if err := s.Delete(ctx, "snap/1/"); err != nil {
			t.Fatal(err)
		}
		check("", "snap/10/c", "snap/2/a", "zz")
		if err := s.Delete(ctx, "snap/1/"); err != nil { // absent is fine
			t.Fatal(err)
		}
		if err := s.Delete(ctx, "nothing/here"); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, "snap"); err != nil {
			t.Fatal(err)
		}
		check("", "zz")
		if _, err := s.Get(ctx, "snap/2/a"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("deleted object still readable: %v", err)
		}
		// Deleting a prefix makes room for an object where its "directory" was.
		put(t, s, "snap", []byte("now an object"))
		check("", "snap", "zz")
	})

	t.Run("InterruptedPut", func(t *testing.T) {
		s := newStore(t)
		put(t, s, "k", []byte("original"))
		// Fail after 20 MB: past the first multipart part of the S3 store.
		_, err := s.Put(ctx, "k", &failingReader{r: randReader(5, 1<<30), n: 20 << 20})
		if !errors.Is(err, errBoom) {
			t.Fatalf("put with a failing reader: %v, want errBoom", err)
		}
		if got := get(t, s, "k"); string(got) != "original" {
			t.Fatalf("previous object damaged: %q", got)
		}
		o, err := s.Stat(ctx, "k")
		if err != nil || !sumOK(s, o.CRC32C, hexCRC([]byte("original"))) || o.Size != 8 {
			t.Fatalf("stat = %+v, %v", o, err)
		}
		_, err = s.Put(ctx, "new", &failingReader{r: randReader(5, 1<<30), n: 1 << 20})
		if !errors.Is(err, errBoom) {
			t.Fatalf("put with a failing reader: %v, want errBoom", err)
		}
		if _, err := s.Stat(ctx, "new"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("interrupted put left an object: %v", err)
		}
		// A cancelled context stops a Put of an endless stream too.
		cctx, cancel := context.WithCancel(ctx)
		go func() { time.Sleep(100 * time.Millisecond); cancel() }()
		if _, err := s.Put(cctx, "k", randReader(6, 1<<40)); err == nil {
			t.Fatal("put with a cancelled context succeeded")
		}
		if got := get(t, s, "k"); string(got) != "original" {
			t.Fatalf("previous object damaged by a cancelled put: %q", got)
		}
		objs, err := s.List(ctx, "")
		if err != nil || fmt.Sprint(keys(objs)) != "[k]" {
			t.Fatalf("list = %v, %v", keys(objs), err)
		}
		noLeftovers(t, s)
	})

	t.Run("InvalidKeys", func(t *testing.T) {
		s := newStore(t)
		put(t, s, "ok", []byte("ok"))
		bad := []string{"", "/abs", "..", "../x", "a/../b", "a/..", "./a", "a/./b", "a//b", "a/", "a\x00b",
			strings.Repeat("a", MaxKeyLen+1), ".ramify-tmp/x"}
		for _, k := range bad {
			if _, err := s.Put(ctx, k, strings.NewReader("x")); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("put %q: %v", k, err)
			}
			if _, err := s.Get(ctx, k); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("get %q: %v", k, err)
			}
			if _, err := s.Stat(ctx, k); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("stat %q: %v", k, err)
			}
			if err := s.Copy(ctx, "ok", k); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("copy to %q: %v", k, err)
			}
			if err := s.Copy(ctx, k, "ok2"); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("copy from %q: %v", k, err)
			}
		}
		for _, p := range []string{"", "/abs", "../", "a/../", "a\x00", "a//"} {
			if err := s.Delete(ctx, p); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("delete %q: %v", p, err)
			}
		}
		for _, p := range []string{"/abs", "../", "a/../b", "a\x00"} {
			if _, err := s.List(ctx, p); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("list %q: %v", p, err)
			}
		}
		objs, err := s.List(ctx, "")
		if err != nil || fmt.Sprint(keys(objs)) != "[ok]" {
			t.Fatalf("invalid keys changed the store: %v, %v", keys(objs), err)
		}
	})
}

func newTestLocal(t testing.TB) *Local {
	l, err := NewLocal(filepath.Join(t.TempDir(), "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestLocalStore(t *testing.T) {
	runStoreSuite(t, func(t *testing.T) Store { return newTestLocal(t) })
}

func TestS3Store(t *testing.T) {
	s3test.Endpoint(t)
	runStoreSuite(t, func(t *testing.T) Store { return newTestS3(t) })
}

// Objects at and around the part size: one request, one full part, parts that end exactly where the stream
// does (no empty last part), a short last part. Each comes back byte for byte with its size and checksum.
func TestS3PartBoundaries(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	s := newTestS3(t)
	for i, size := range []int{0, s3PartSize - 1, s3PartSize, s3PartSize + 1, 2 * s3PartSize, (s3Parallel+1)*s3PartSize + 7} {
		data := randBytes(uint64(20+i), size)
		key := fmt.Sprintf("edge/%d", size)
		o := put(t, s, key, data)
		if o.Size != int64(size) || o.CRC32C != hexCRC(data) {
			t.Fatalf("put %d bytes = %+v", size, o)
		}
		if got := get(t, s, key); !bytes.Equal(got, data) {
			t.Fatalf("get %d bytes: %d bytes back, equal %v", size, len(got), bytes.Equal(got, data))
		}
	}
	noLeftovers(t, s)
}

func TestLocalSpecifics(t *testing.T) {
	ctx := context.Background()
	l := newTestLocal(t)
	if !strings.HasPrefix(l.Name(), "local:/") {
		t.Errorf("name %q", l.Name())
	}
	put(t, l, "a", []byte("x"))
	if _, err := l.Put(ctx, "a/b", strings.NewReader("y")); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("put under an object: %v, want ErrConflict", err)
	}
	put(t, l, "d/e", []byte("x"))
	if _, err := l.Put(ctx, "d", strings.NewReader("y")); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("put over a prefix: %v, want ErrConflict", err)
	}
	// Symlinks planted in the store cannot lead outside it.
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(l.dir, objectsDir, "evil")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Get(ctx, "evil/secret"); err == nil {
		t.Error("get through a symlink to outside the store succeeded")
	}
	if _, err := l.Put(ctx, "evil/new", strings.NewReader("x")); err == nil {
		t.Error("put through a symlink to outside the store succeeded")
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); err == nil {
		t.Error("put wrote outside the store")
	}
	// Objects are private.
	fi, err := os.Stat(filepath.Join(l.dir, objectsDir, "a"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("object mode %v, %v", fi.Mode(), err)
	}
	// Reopening the store finds its objects and checksums.
	l2, err := NewLocal(l.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if o, err := l2.Stat(ctx, "a"); err != nil || o.CRC32C != hexCRC([]byte("x")) {
		t.Errorf("after reopen: %+v, %v", o, err)
	}
}

// TestThroughput measures put and get of a 256 MB object on both stores (skipped with -short).
func TestThroughput(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	const size = 256 << 20
	for _, tc := range []struct {
		name string
		new  func(t *testing.T) Store
	}{
		{"local", func(t *testing.T) Store { return newTestLocal(t) }},
		{"s3", func(t *testing.T) Store { return newTestS3(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.new(t)
			ctx := context.Background()
			start := time.Now()
			if _, err := s.Put(ctx, "tp/object", randReader(9, size)); err != nil {
				t.Fatal(err)
			}
			putDur := time.Since(start)
			start = time.Now()
			rc, err := s.Get(ctx, "tp/object")
			if err != nil {
				t.Fatal(err)
			}
			n, err := io.Copy(io.Discard, rc)
			rc.Close()
			if err != nil || n != size {
				t.Fatalf("get: %d, %v", n, err)
			}
			getDur := time.Since(start)
			mbps := func(d time.Duration) float64 { return float64(size) / (1 << 20) / d.Seconds() }
			t.Logf("THROUGHPUT %s (%s): put 256 MB in %v = %.0f MB/s, get in %v = %.0f MB/s", tc.name, s.Name(),
				putDur.Round(time.Millisecond), mbps(putDur), getDur.Round(time.Millisecond), mbps(getDur))
		})
	}
}

// The local store copies an object by a hard link to its file (objects never change once published): no data
// is copied, and the copy has its checksum.
func TestLocalCopyLinks(t *testing.T) {
	ctx := context.Background()
	l := newTestLocal(t)
	data := randBytes(11, 5<<20)
	put(t, l, "s/1/session.bin", data)
	if err := l.Copy(ctx, "s/1/session.bin", "s/2/session.bin"); err != nil {
		t.Fatal(err)
	}
	a, err := os.Stat(filepath.Join(l.dir, objectsDir, "s", "1", "session.bin"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.Stat(filepath.Join(l.dir, objectsDir, "s", "2", "session.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(a, b) {
		t.Fatal("the copy is a file of its own, not a link to its source's")
	}
	if o, err := l.Stat(ctx, "s/2/session.bin"); err != nil || o.CRC32C != hexCRC(data) || o.Size != int64(len(data)) {
		t.Fatalf("stat of the copy = %+v, %v", o, err)
	}
	noLeftovers(t, l)
}

// An object an earlier version wrote carries SHA-256 (its xattr user.ramify.sha256), not CRC-32C: Stat reports it
// as that, and a Copy (linked, or copied byte by byte where no link can be made) carries it over.
func TestLocalKeepsOlderChecksums(t *testing.T) {
	ctx := context.Background()
	l := newTestLocal(t)
	data := randBytes(12, 3<<20)
	put(t, l, "old/session.bin", data)
	file := filepath.Join(l.dir, objectsDir, "old", "session.bin")
	if err := unix.Removexattr(file, crc32cXattr); err != nil {
		t.Fatal(err)
	}
	old := fmt.Sprintf("%x", sha256.Sum256(data))
	if err := unix.Setxattr(file, sha256Xattr, []byte(old), 0); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"old/session.bin", "copy/session.bin"} {
		if key != "old/session.bin" {
			if err := l.Copy(ctx, "old/session.bin", key); err != nil {
				t.Fatal(err)
			}
		}
		if o, err := l.Stat(ctx, key); err != nil || o.Sum != (Sum{SHA256: old}) {
			t.Fatalf("stat %s = %+v, %v; want sha256 %s", key, o, err, old)
		}
	}
	// Its Sum checks bytes in its own algorithm.
	sum := Sum{SHA256: old}
	h := sum.NewHash()
	h.Write(data)
	if got := sum.Of(h); got != sum || sum.Algorithm() != "sha256" {
		t.Fatalf("sha256 sum of the data: %v (%s), want %v", got, sum.Algorithm(), sum)
	}
	if c := (Sum{CRC32C: hexCRC(data)}); c.Algorithm() != "crc32c" || func() Sum { h := c.NewHash(); h.Write(data); return c.Of(h) }() != c {
		t.Fatalf("crc32c sum of the data does not match %v", c)
	}
}

// The local store reads large objects ahead with direct I/O: every byte comes back in order whatever the size
// (a last chunk short, or none), and a reader closed part way, or before its first read, stops its read-ahead.
func TestLocalReadAhead(t *testing.T) {
	ctx := context.Background()
	l := newTestLocal(t)
	for _, size := range []int{directChunk, directReadChunk - 4096, 3*directReadChunk + 12345, directAhead*directReadChunk + 1, 9 * directReadChunk} {
		data := randBytes(uint64(size), size)
		put(t, l, "ra/obj", data)
		rc, err := l.Get(ctx, "ra/obj")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := rc.(*directReader); !ok {
			t.Skipf("the store's file system refuses O_DIRECT (%T)", rc)
		}
		// Odd-sized reads: chunk boundaries fall inside them.
		var got bytes.Buffer
		buf := make([]byte, 1<<20+7)
		for {
			n, err := rc.Read(buf)
			got.Write(buf[:n])
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("size %d: read: %v", size, err)
			}
		}
		if n, err := rc.Read(buf); n != 0 || err != io.EOF {
			t.Fatalf("size %d: a read after the end: %d, %v", size, n, err)
		}
		if err := rc.Close(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), data) {
			t.Fatalf("size %d: read back %d bytes, not what was put", size, got.Len())
		}
	}
	// An object cut short under a reader (it never is: objects do not change) is an error, never a clean end.
	rc, err := l.Get(ctx, "ra/obj")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(l.dir, objectsDir, "ra", "obj"), 2*directReadChunk+100); err != nil {
		t.Fatal(err)
	}
	if n, err := io.Copy(io.Discard, rc); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("an object cut short under its reader: %d bytes, %v; want io.ErrUnexpectedEOF", n, err)
	}
	rc.Close()
	before := runtime.NumGoroutine()
	for i := range 20 {
		rc, err := l.Get(ctx, "ra/obj")
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			if _, err := io.ReadFull(rc, make([]byte, directReadChunk+1)); err != nil {
				t.Fatal(err)
			}
		}
		if err := rc.Close(); err != nil {
			t.Fatal(err)
		}
		if err := rc.Close(); err != nil {
			t.Fatalf("a second close: %v", err)
		}
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Fatalf("goroutines %d before 20 readers closed early, %d after", before, after)
	}
}

// A Delete cut short (its objects removed, not their directories) leaves empty directories that no List sees:
// RemoveTemps, run as a server with its own store starts, prunes them and leaves every object's.
func TestLocalRemoveTempsPrunesEmptyDirs(t *testing.T) {
	l := newTestLocal(t)
	ctx := context.Background()
	for _, k := range []string{"sbx_a/1/session.bin", "sbx_b/1/session.bin", "sbx_b/2/layer.tar"} {
		if _, err := l.Put(ctx, k, strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"sbx_a/1/session.bin", "sbx_b/1/session.bin"} { // as a cut Delete leaves them
		if err := os.Remove(filepath.Join(l.dir, objectsDir, k)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.RemoveTemps(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"sbx_a", "sbx_b/1"} {
		if _, err := os.Stat(filepath.Join(l.dir, objectsDir, d)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("empty directory %s left: %v", d, err)
		}
	}
	if objs, err := l.List(ctx, ""); err != nil || len(objs) != 1 || objs[0].Key != "sbx_b/2/layer.tar" {
		t.Errorf("objects after RemoveTemps: %+v, %v; want sbx_b/2/layer.tar alone", objs, err)
	}
}

// A Put under a prefix whose other keys are being deleted (a sandbox's next pause writing while its previous
// snapshot is dropped) never fails: the Delete prunes the directories it empties, which may be the one the Put
// has just made or is making.
func TestLocalPutDuringDeleteOfItsNeighbours(t *testing.T) {
	l, err := NewLocal(filepath.Join(t.TempDir(), "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 300 {
		old, next := fmt.Sprintf("sbx/%d/", i), fmt.Sprintf("sbx/%d/", i+1)
		if i == 0 {
			if _, err := l.Put(ctx, old+"session.bin", strings.NewReader("x")); err != nil {
				t.Fatal(err)
			}
		}
		done := make(chan error, 1)
		go func() { done <- l.Delete(ctx, old) }()
		if _, err := l.Put(ctx, next+"session.bin", strings.NewReader("y")); err != nil {
			t.Fatalf("put %d while its neighbour is deleted: %v", i+1, err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
