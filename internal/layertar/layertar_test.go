package layertar

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("layertar tests need root (mknod, chown, trusted.* xattrs)")
	}
}

// node is everything the round trip must preserve about one path.
type node struct {
	Type       uint32
	Mode       uint32
	UID, GID   uint32
	Size       int64
	Mtime      int64 // ns
	Rdev       uint64
	Xattrs     map[string]string
	SHA256     string
	Link       string // symlink target
	HardlinkOf string // first path (in walk order) of the same inode, for multiply linked non-dirs
}

// snapshot walks dir (lstat, xattrs, content hash, link targets, inode sharing) and returns it by
// relative path ("." for dir itself). Sockets are left out.
func snapshot(t testing.TB, dir string) map[string]node {
	t.Helper()
	out := map[string]node{}
	inodes := map[[2]uint64]string{}
	var walk func(abs, rel string)
	walk = func(abs, rel string) {
		var st unix.Stat_t
		if err := unix.Lstat(abs, &st); err != nil {
			t.Fatal(err)
		}
		typ := st.Mode & unix.S_IFMT
		if typ == unix.S_IFSOCK {
			return
		}
		n := node{Type: typ, Mode: st.Mode & 07777, UID: st.Uid, GID: st.Gid,
			Mtime: st.Mtim.Sec*1e9 + st.Mtim.Nsec}
		xs, err := listXattrs(-1, abs)
		if err != nil {
			t.Fatal(err)
		}
		if len(xs) > 0 {
			n.Xattrs = xs
		}
		if typ != unix.S_IFDIR && st.Nlink > 1 {
			key := [2]uint64{uint64(st.Dev), st.Ino}
			if first, ok := inodes[key]; ok {
				n.HardlinkOf = first
			} else {
				inodes[key] = rel
			}
		}
		switch typ {
		case unix.S_IFREG:
			n.Size = st.Size
			f, err := os.Open(abs)
			if err != nil {
				t.Fatal(err)
			}
			h := sha256.New()
			if _, err := io.Copy(h, f); err != nil {
				t.Fatal(err)
			}
			f.Close()
			n.SHA256 = hex.EncodeToString(h.Sum(nil))
		case unix.S_IFLNK:
			l, err := os.Readlink(abs)
			if err != nil {
				t.Fatal(err)
			}
			n.Link = l
		case unix.S_IFCHR, unix.S_IFBLK:
			n.Rdev = uint64(st.Rdev)
		}
		out[rel] = n
		if typ == unix.S_IFDIR {
			ents, err := os.ReadDir(abs)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				r := e.Name()
				if rel != "." {
					r = rel + "/" + e.Name()
				}
				walk(filepath.Join(abs, e.Name()), r)
			}
		}
	}
	walk(dir, ".")
	return out
}

func compareTrees(t *testing.T, want, got map[string]node) {
	t.Helper()
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	bad := 0
	for _, k := range keys {
		w, okw := want[k]
		g, okg := got[k]
		switch {
		case !okw:
			t.Errorf("%q: extra in extracted tree: %+v", k, g)
		case !okg:
			t.Errorf("%q: missing from extracted tree: %+v", k, w)
		case !reflect.DeepEqual(w, g):
			t.Errorf("%q differs:\nwant %+v\n got %+v", k, w, g)
		default:
			continue
		}
		if bad++; bad > 20 {
			t.Fatal("too many differences")
		}
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func setTimes(t testing.TB, p string, sec, nsec int64) {
	t.Helper()
	ts := []unix.Timespec{{Sec: sec, Nsec: nsec}, {Sec: sec, Nsec: nsec}}
	must(t, unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW))
}

const bigSize = 50 << 20

// writePseudoRandom writes n deterministic pseudo-random bytes to p, in chunks.
func writePseudoRandom(t testing.TB, p string, n int64, seed uint64) {
	t.Helper()
	f, err := os.Create(p)
	must(t, err)
	r := rand.New(rand.NewPCG(seed, seed))
	buf := make([]byte, 1<<20)
	for n > 0 {
		for i := 0; i+8 <= len(buf); i += 8 {
			v := r.Uint64()
			for j := 0; j < 8; j++ {
				buf[i+j] = byte(v >> (8 * j))
			}
		}
		m := int64(len(buf))
		if m > n {
			m = n
		}
		_, err := f.Write(buf[:m])
		must(t, err)
		n -= m
	}
	must(t, f.Close())
}

// makeFixture builds a tree with everything an overlay upper directory can hold. It returns the number of
// sockets it made.
func makeFixture(t testing.TB, dir string, big bool) {
	t.Helper()
	p := func(rel string) string { return filepath.Join(dir, rel) }
	for _, d := range []string{"nested/a/b/c/d", "empty", "opq/sub", "redir", "hl", "hl2", "sticky", "sgid", "ro"} {
		must(t, os.MkdirAll(p(d), 0o755))
	}
	// overlay whiteout and opaque/redirect directories
	must(t, unix.Mknod(p("opq/whiteout"), unix.S_IFCHR|0, 0))
	must(t, unix.Mknod(p("whiteout-top"), unix.S_IFCHR|0, 0))
	must(t, unix.Lsetxattr(p("opq"), "trusted.overlay.opaque", []byte("y"), 0))
	must(t, unix.Lsetxattr(p("redir"), "trusted.overlay.redirect", []byte("/old/place"), 0))
	must(t, unix.Lsetxattr(p("redir"), "user.overlay.origin", []byte{0, 1, 2, 0xff, 0}, 0))
	must(t, unix.Mknod(p("blockdev"), unix.S_IFBLK|0o660, int(unix.Mkdev(7, 3))))
	must(t, unix.Mknod(p("chardev"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(t, unix.Mkfifo(p("fifo"), 0o640))
	// files
	must(t, os.WriteFile(p("nested/a/b/c/d/deep.txt"), []byte("deep\n"), 0o644))
	must(t, os.WriteFile(p("user-xattr"), []byte("hello"), 0o644))
	must(t, unix.Lsetxattr(p("user-xattr"), "user.foo", []byte("bar"), 0))
	must(t, unix.Lsetxattr(p("user-xattr"), "trusted.bin", []byte{0, 0, 7}, 0))
	must(t, os.WriteFile(p("setuid"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.Chmod(p("setuid"), 0o755|os.ModeSetuid|os.ModeSetgid))
	must(t, os.Chown(p("setuid"), 100000, 100000))
	must(t, os.Chmod(p("setuid"), 0o755|os.ModeSetuid|os.ModeSetgid)) // chown cleared them
	must(t, os.Chmod(p("sticky"), 0o777|os.ModeSticky))
	must(t, os.Chmod(p("sgid"), 0o775|os.ModeSetgid))
	must(t, os.Chmod(p("ro"), 0o555))
	must(t, os.WriteFile(p("owned"), []byte("x"), 0o600))
	must(t, os.Lchown(p("owned"), 100005, 100007))
	must(t, os.WriteFile(p("nul"), []byte("a\x00b\x00\x00c"), 0o644))
	must(t, os.WriteFile(p("emptyfile"), nil, 0o000))
	must(t, os.WriteFile(p("caf\xe9 non-utf8"), []byte("latin1"), 0o644))
	must(t, os.WriteFile(p("with\nnewline and space"), []byte("nl"), 0o644))
	long := strings.Repeat("long-name-", 20)
	must(t, os.MkdirAll(p("nested/"+long), 0o755))
	must(t, os.WriteFile(p("nested/"+long+"/"+long), []byte("long"), 0o644))
	// hard links: a pair in one dir and a third link elsewhere
	must(t, os.WriteFile(p("hl/a"), []byte("shared inode"), 0o640))
	must(t, os.Link(p("hl/a"), p("hl/b")))
	must(t, os.Link(p("hl/a"), p("hl2/c")))
	must(t, os.Lchown(p("hl/a"), 100001, 100001))
	// symlinks, absolute, relative, dangling, to a directory; one owned and with a trusted xattr
	must(t, os.Symlink("/etc/passwd", p("abs-link")))
	must(t, os.Symlink("../nul", p("nested/rel-link")))
	must(t, os.Symlink("does/not/exist", p("dangling")))
	must(t, os.Symlink("nested", p("dir-link")))
	must(t, os.Lchown(p("abs-link"), 100002, 100003))
	must(t, unix.Lsetxattr(p("abs-link"), "trusted.overlay.origin", []byte("o"), 0))
	// a hard link to a symlink
	must(t, os.Link(p("dangling"), p("hl2/dangling-hardlink")))
	// a socket (skipped)
	l, err := net.Listen("unix", p("sock"))
	must(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if big {
		writePseudoRandom(t, p("big"), bigSize, 1)
	}
	// the root itself
	must(t, os.Chmod(dir, 0o751))
	must(t, os.Chown(dir, 100000, 100000))
	must(t, unix.Lsetxattr(dir, "trusted.overlay.opaque", []byte("y"), 0))
	// mtimes with nanoseconds, children before parents
	var all []string
	must(t, filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		all = append(all, path)
		return err
	}))
	for i := len(all) - 1; i >= 0; i-- {
		setTimes(t, all[i], 1_600_000_000+int64(i), int64(123456789+i))
	}
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
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak {
				peak = m.HeapAlloc
			}
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

func TestRoundTrip(t *testing.T) {
	requireRoot(t)
	src, dst := t.TempDir(), t.TempDir()
	makeFixture(t, src, true)
	want := snapshot(t, src)
	// dst must end up like src even though it starts with different attributes and stale content.
	must(t, unix.Lsetxattr(dst, "user.stale", []byte("1"), 0))
	must(t, os.WriteFile(filepath.Join(dst, "stale"), nil, 0o644))

	var wst, xst Stats
	var werr, xerr error
	peak := heapPeak(func() {
		pr, pw := io.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			wst, werr = Write(pw, src, nil, 0)
			pw.CloseWithError(werr)
		}()
		xst, xerr = Extract(pr, dst)
		pr.CloseWithError(errors.New("extract stopped"))
		<-done
	})
	must(t, werr)
	must(t, xerr)
	t.Logf("write %+v, extract %+v, peak heap growth %.1f MB", wst, xst, float64(peak)/(1<<20))
	if peak > 32<<20 {
		t.Errorf("peak heap growth %d MB while streaming a %d MB file, want < 32 MB", peak>>20, bigSize>>20)
	}
	if wst.Skipped != 1 {
		t.Errorf("Skipped = %d, want 1 (the socket)", wst.Skipped)
	}
	if wst.Entries != xst.Entries || wst.Files != xst.Files || wst.Bytes != xst.Bytes {
		t.Errorf("write stats %+v != extract stats %+v", wst, xst)
	}
	if wst.Bytes < bigSize {
		t.Errorf("Bytes = %d, want >= %d", wst.Bytes, bigSize)
	}
	got := snapshot(t, dst)
	// The stale file is not in the tar; Extract only adds and replaces. Everything else must be equal.
	if _, ok := got["stale"]; !ok {
		t.Error("stale file vanished")
	}
	delete(got, "stale")
	compareTrees(t, want, got)

	// Extracting again over the result is idempotent (everything replaced in place).
	var buf bytes.Buffer
	src2 := t.TempDir()
	makeFixture(t, src2, false)
	_, err := Write(&buf, src2, nil, 0)
	must(t, err)
	data := buf.Bytes()
	dst2 := t.TempDir()
	for i := 0; i < 2; i++ {
		if _, err := Extract(bytes.NewReader(data), dst2); err != nil {
			t.Fatalf("extract #%d: %v", i+1, err)
		}
	}
	compareTrees(t, snapshot(t, src2), snapshot(t, dst2))
}

func TestWriteHeaders(t *testing.T) {
	requireRoot(t)
	src := t.TempDir()
	makeFixture(t, src, false)
	var buf bytes.Buffer
	_, err := Write(&buf, src, nil, 0)
	must(t, err)
	tr := tar.NewReader(&buf)
	seen := map[string]*tar.Header{}
	first := true
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		if first && hdr.Name != "." {
			t.Errorf("first entry %q, want \".\"", hdr.Name)
		}
		first = false
		seen[hdr.Name] = hdr
	}
	check := func(name string, typ byte) *tar.Header {
		h := seen[name]
		if h == nil {
			t.Fatalf("no entry %q", name)
		}
		if h.Typeflag != typ {
			t.Errorf("%q: type %q, want %q", name, h.Typeflag, typ)
		}
		return h
	}
	if h := check(".", tar.TypeDir); h.PAXRecords["SCHILY.xattr.trusted.overlay.opaque"] != "y" || h.Uid != 100000 {
		t.Errorf("root entry %+v", h)
	}
	if h := check("opq/whiteout", tar.TypeChar); h.Devmajor != 0 || h.Devminor != 0 {
		t.Errorf("whiteout %+v", h)
	}
	if h := check("hl/b", tar.TypeLink); h.Linkname != "hl/a" {
		t.Errorf("hard link %+v", h)
	}
	if h := check("abs-link", tar.TypeSymlink); h.Linkname != "/etc/passwd" {
		t.Errorf("symlink %+v", h)
	}
	if h := check("setuid", tar.TypeReg); h.Mode != 0o6755 {
		t.Errorf("setuid mode %o", h.Mode)
	}
	if h := check("owned", tar.TypeReg); h.ModTime.Nanosecond() == 0 {
		t.Errorf("mtime lost its nanoseconds: %v", h.ModTime)
	}
	check("nested/", tar.TypeDir)
	check("fifo", tar.TypeFifo)
	if _, ok := seen["sock"]; ok {
		t.Error("socket was written")
	}
}

func TestSkip(t *testing.T) {
	requireRoot(t)
	src, dst := t.TempDir(), t.TempDir()
	makeFixture(t, src, false)
	skipped := map[string]bool{}
	skip := func(rel string) bool {
		if rel == "nested" || rel == "nul" || rel == "hl/a" {
			skipped[rel] = true
			return true
		}
		if strings.HasPrefix(rel, "nested/") {
			t.Errorf("skip called for %q inside a skipped directory", rel)
		}
		return false
	}
	var buf bytes.Buffer
	_, err := Write(&buf, src, skip, 0)
	must(t, err)
	if len(skipped) != 3 {
		t.Errorf("skip saw %v", skipped)
	}
	_, err = Extract(&buf, dst)
	must(t, err)
	want := snapshot(t, src)
	for k := range want {
		if k == "nested" || strings.HasPrefix(k, "nested/") || k == "nul" || k == "hl/a" {
			delete(want, k)
		}
	}
	// hl/a skipped: hl/b is now the first path of the inode.
	for k, n := range want {
		if n.HardlinkOf == "hl/a" {
			n.HardlinkOf = ""
			if k != "hl/b" {
				n.HardlinkOf = "hl/b"
			}
			want[k] = n
		}
	}
	got := snapshot(t, dst)
	// The root's and hl's mtimes are as recorded; only paths differ.
	compareTrees(t, want, got)
}

// tarOf builds a tar from headers (regular files get body "data").
func tarOf(t testing.TB, hdrs ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		body := []byte(nil)
		if h.Typeflag == tar.TypeReg {
			body = []byte("data")
			h.Size = int64(len(body))
		}
		must(t, tw.WriteHeader(h))
		_, err := tw.Write(body)
		must(t, err)
	}
	must(t, tw.Close())
	return buf.Bytes()
}

// sandboxDirs makes base/dst (where to extract) and base/outside (with a secret file), and returns a
// function that checks that base holds nothing but those and outside is untouched.
func sandboxDirs(t testing.TB) (dst, outside string, check func()) {
	base := t.TempDir()
	dst, outside = filepath.Join(base, "dst"), filepath.Join(base, "outside")
	must(t, os.Mkdir(dst, 0o755))
	must(t, os.Mkdir(outside, 0o755))
	must(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600))
	before := snapshot(t, outside)
	return dst, outside, func() {
		t.Helper()
		ents, err := os.ReadDir(base)
		must(t, err)
		if len(ents) != 2 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Fatalf("extract wrote beside dst: %v", names)
		}
		after := snapshot(t, outside)
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("extract changed a directory outside dst:\nbefore %+v\nafter  %+v", before, after)
		}
	}
}

func TestExtractRefusesEscapes(t *testing.T) {
	requireRoot(t)
	cases := []struct {
		name string
		hdrs []*tar.Header
	}{
		{"dotdot file", []*tar.Header{{Typeflag: tar.TypeReg, Name: "../outside/x"}}},
		{"dotdot inside", []*tar.Header{{Typeflag: tar.TypeReg, Name: "a/../../outside/secret"}}},
		{"absolute", []*tar.Header{{Typeflag: tar.TypeReg, Name: "/abs"}}},
		{"absolute dir", []*tar.Header{{Typeflag: tar.TypeDir, Name: "/tmp/"}}},
		{"symlink then file through it", []*tar.Header{
			{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "../outside"},
			{Typeflag: tar.TypeReg, Name: "l/secret"},
		}},
		{"absolute symlink then file through it", []*tar.Header{
			{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "/"},
			{Typeflag: tar.TypeReg, Name: "l/tmp/escaped"},
		}},
		{"symlink then dir and symlink through it", []*tar.Header{
			{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "../outside"},
			{Typeflag: tar.TypeDir, Name: "l/newdir/"},
		}},
		{"hard link to outside", []*tar.Header{{Typeflag: tar.TypeLink, Name: "h", Linkname: "../outside/secret"}}},
		{"hard link to absolute", []*tar.Header{{Typeflag: tar.TypeLink, Name: "h", Linkname: "/etc/passwd"}}},
		{"hard link through symlink", []*tar.Header{
			{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "../outside"},
			{Typeflag: tar.TypeLink, Name: "h", Linkname: "l/secret"},
		}},
		{"device through symlink", []*tar.Header{
			{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "../outside"},
			{Typeflag: tar.TypeChar, Name: "l/dev", Devmajor: 1, Devminor: 3},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst, _, check := sandboxDirs(t)
			_, err := Extract(bytes.NewReader(tarOf(t, c.hdrs...)), dst)
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("err = %v, want ErrInvalid", err)
			}
			check()
		})
	}
	t.Run("file replaces symlink instead of writing through it", func(t *testing.T) {
		dst, outside, check := sandboxDirs(t)
		data := tarOf(t,
			&tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: filepath.Join(outside, "secret")},
			&tar.Header{Typeflag: tar.TypeReg, Name: "l"},
			&tar.Header{Typeflag: tar.TypeSymlink, Name: "d", Linkname: outside},
			&tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o700},
			&tar.Header{Typeflag: tar.TypeReg, Name: "d/secret"},
		)
		_, err := Extract(bytes.NewReader(data), dst)
		must(t, err)
		check()
		if b, err := os.ReadFile(filepath.Join(dst, "l")); err != nil || string(b) != "data" {
			t.Errorf("l = %q, %v", b, err)
		}
		if fi, err := os.Lstat(filepath.Join(dst, "d")); err != nil || !fi.IsDir() {
			t.Errorf("d: %v %v", fi, err)
		}
	})
}

func FuzzExtract(f *testing.F) {
	requireRoot(f)
	src := f.TempDir()
	must(f, os.MkdirAll(filepath.Join(src, "d/e"), 0o755))
	must(f, os.WriteFile(filepath.Join(src, "d/f"), []byte("abc"), 0o644))
	must(f, os.Link(filepath.Join(src, "d/f"), filepath.Join(src, "g")))
	must(f, os.Symlink("../x", filepath.Join(src, "d/s")))
	must(f, unix.Mknod(filepath.Join(src, "w"), unix.S_IFCHR, 0))
	must(f, unix.Lsetxattr(filepath.Join(src, "d"), "trusted.overlay.opaque", []byte("y"), 0))
	makeSparse(f, filepath.Join(src, "d/sparse"), sparseShape{size: 1 << 20, data: [][2]int64{{512 << 10, 10}}})
	var buf bytes.Buffer
	_, err := Write(&buf, src, nil, 0)
	must(f, err)
	f.Add(buf.Bytes())
	f.Add(tarOf(f, &tar.Header{Typeflag: tar.TypeReg, Name: "../x"}))
	f.Add(tarOf(f, &tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "../outside"},
		&tar.Header{Typeflag: tar.TypeReg, Name: "l/secret"}))
	f.Add(tarOf(f, &tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "../outside/secret"},
		&tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "l"},
		&tar.Header{Typeflag: tar.TypeReg, Name: "h"}))
	f.Add(tarOf(f, &tar.Header{Typeflag: tar.TypeDir, Name: "a/"},
		&tar.Header{Typeflag: tar.TypeReg, Name: "a"},
		&tar.Header{Typeflag: tar.TypeReg, Name: "a/b"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		dst, outside, check := sandboxDirs(t)
		// A symlink already in dst pointing outside must not be written through either.
		must(t, os.Symlink(outside, filepath.Join(dst, "pre")))
		_, _ = Extract(bytes.NewReader(data), dst)
		check()
	})
}

func TestExtractErrors(t *testing.T) {
	requireRoot(t)
	dst := t.TempDir()
	if _, err := Extract(bytes.NewReader(tarOf(t, &tar.Header{Typeflag: tar.TypeReg, Name: "."})), dst); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("root as file: %v", err)
	}
	if _, err := Extract(strings.NewReader(strings.Repeat("garbage!", 200)), dst); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("garbage: %v", err)
	}
	if _, err := Write(io.Discard, filepath.Join(dst, "missing"), nil, 0); err == nil {
		t.Error("Write of a missing dir succeeded")
	}
	// A truncated stream is an error, not a silently short file.
	src := t.TempDir()
	writePseudoRandom(t, filepath.Join(src, "f"), 1<<20, 2)
	var buf bytes.Buffer
	_, err := Write(&buf, src, nil, 0)
	must(t, err)
	if _, err := Extract(bytes.NewReader(buf.Bytes()[:buf.Len()/2]), t.TempDir()); err == nil {
		t.Error("truncated tar extracted without error")
	}
}
