package files

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

const testUID, testGID = 100000, 100000

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

// newFS returns an FS on a fresh root directory and that directory's parent (for "outside" fixtures).
func newFS(t testing.TB) (*FS, string, string) {
	t.Helper()
	requireRoot(t)
	base := t.TempDir()
	root := filepath.Join(base, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := Open(root, testUID, testGID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, root, base
}

func owner(t testing.TB, p string) (uint32, uint32) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

func readAll(t testing.TB, f *FS, p string) string {
	t.Helper()
	r, _, err := f.OpenRead(p)
	if err != nil {
		t.Fatalf("OpenRead(%s): %v", p, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustWrite(t testing.TB, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func TestReadWriteRoundTrip(t *testing.T) {
	f, root, _ := newFS(t)
	data := []byte("hello\x00world\x00\xff\xfe binary\n")
	n, err := f.Write("/a/b/c.bin", bytes.NewReader(data), 0)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(len(data)) {
		t.Fatalf("wrote %d, want %d", n, len(data))
	}
	r, e, err := f.OpenRead("/a/b/c.bin")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if !bytes.Equal(got, data) {
		t.Fatalf("read %q, want %q", got, data)
	}
	if e.Name != "c.bin" || e.Path != "/a/b/c.bin" || e.Type != "file" || e.Size != int64(len(data)) || e.Mode != "0644" {
		t.Fatalf("entry %+v", e)
	}
	for _, p := range []string{"a", "a/b", "a/b/c.bin"} {
		if u, g := owner(t, filepath.Join(root, p)); u != testUID || g != testGID {
			t.Errorf("%s owned by %d:%d", p, u, g)
		}
	}
	for p, want := range map[string]fs.FileMode{"a": fs.ModeDir | 0o755, "a/b": fs.ModeDir | 0o755, "a/b/c.bin": 0o644} {
		fi, _ := os.Lstat(filepath.Join(root, p))
		if fi.Mode() != want {
			t.Errorf("%s mode %v, want %v", p, fi.Mode(), want)
		}
	}
	// Empty file.
	if _, err := f.Write("/empty", strings.NewReader(""), 0o600); err != nil {
		t.Fatal(err)
	}
	if s := readAll(t, f, "/empty"); s != "" {
		t.Fatalf("empty file read %q", s)
	}
}

func TestWriteModes(t *testing.T) {
	f, _, _ := newFS(t)
	for _, tc := range []struct {
		mode os.FileMode
		want string
	}{
		{0, "0644"},
		{0o600, "0600"},
		{0o4755, "4755"}, // raw unix bits
		{fs.ModeSetuid | fs.ModeSetgid | 0o755, "6755"},
		{fs.ModeSticky | 0o777, "1777"},
	} {
		if _, err := f.Write("/m", strings.NewReader("x"), tc.mode); err != nil {
			t.Fatal(err)
		}
		e, err := f.Stat("/m")
		if err != nil {
			t.Fatal(err)
		}
		if e.Mode != tc.want {
			t.Errorf("mode %v: got %s, want %s", tc.mode, e.Mode, tc.want)
		}
	}
}

// genReader produces n bytes of a repeating pattern without allocating, sampling the heap as it goes.
type genReader struct {
	left, read int64
	peak       uint64
	sample     func() uint64
}

func (g *genReader) Read(b []byte) (int, error) {
	if g.left == 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > g.left {
		b = b[:g.left]
	}
	for i := range b {
		b[i] = byte((g.read + int64(i)) % 251)
	}
	before := g.read / (16 << 20)
	g.left -= int64(len(b))
	g.read += int64(len(b))
	if g.read/(16<<20) != before {
		if h := g.sample(); h > g.peak {
			g.peak = h
		}
	}
	return len(b), nil
}

func TestWriteLargeStreamed(t *testing.T) {
	f, root, _ := newFS(t)
	const size = 200 << 20
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	runtime.GC()
	base := heap()
	g := &genReader{left: size, sample: heap}
	n, err := f.Write("/big/file", g, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n != size {
		t.Fatalf("wrote %d", n)
	}
	if h := heap(); h > g.peak {
		g.peak = h
	}
	t.Logf("heap in use: base %d MB, peak %d MB", base>>20, g.peak>>20)
	if g.peak > base && g.peak-base > 32<<20 {
		t.Fatalf("heap grew by %d MB during a streamed write", (g.peak-base)>>20)
	}
	fi, err := os.Stat(filepath.Join(root, "big/file"))
	if err != nil || fi.Size() != size {
		t.Fatalf("stat: %v %v", fi, err)
	}
	// Spot-check content at an offset.
	r, _, err := f.OpenRead("/big/file")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, 16)
	off := int64(123456789)
	if _, err := r.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	for i, b := range buf {
		if b != byte((off+int64(i))%251) {
			t.Fatalf("byte %d = %d", off+int64(i), b)
		}
	}
}

type failingReader struct{ n int }

func (r *failingReader) Read(b []byte) (int, error) {
	if r.n <= 0 {
		return 0, errors.New("client went away")
	}
	k := min(len(b), r.n)
	for i := range b[:k] {
		b[i] = 'N'
	}
	r.n -= k
	return k, nil
}

func TestAtomicReplace(t *testing.T) {
	f, root, _ := newFS(t)
	target := filepath.Join(root, "dir/file")
	mustWrite(t, target, "old content", 0o600)
	if _, err := f.Write("/dir/file", &failingReader{n: 100000}, 0); err == nil {
		t.Fatal("write with a failing body succeeded")
	}
	if b, _ := os.ReadFile(target); string(b) != "old content" {
		t.Fatalf("after failed write: %q", b)
	}
	ents, _ := os.ReadDir(filepath.Join(root, "dir"))
	if len(ents) != 1 {
		t.Fatalf("leftover temp files: %v", ents)
	}
	// A reader holding an fd on the old file still sees the old content after a replace.
	old, _, err := f.OpenRead("/dir/file")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := f.Write("/dir/file", strings.NewReader("new"), 0o640); err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(old); string(b) != "old content" {
		t.Fatalf("old fd reads %q", b)
	}
	if s := readAll(t, f, "/dir/file"); s != "new" {
		t.Fatalf("read %q", s)
	}
	fi, _ := os.Stat(target)
	if fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v", fi.Mode())
	}
	if u, g := owner(t, target); u != testUID || g != testGID {
		t.Fatalf("owner %d:%d", u, g)
	}
	// A directory in the way.
	os.Mkdir(filepath.Join(root, "d2"), 0o755)
	if _, err := f.Write("/d2", strings.NewReader("x"), 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("write over dir: %v", err)
	}
	if _, err := f.Write("/", strings.NewReader("x"), 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("write /: %v", err)
	}
	// A file in the way of a parent.
	if _, err := f.Write("/dir/file/x", strings.NewReader("x"), 0); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("write under a file: %v", err)
	}
}

func TestReadErrors(t *testing.T) {
	f, root, _ := newFS(t)
	os.Mkdir(filepath.Join(root, "dir"), 0o755)
	_, _, err := f.OpenRead("/missing")
	if !errors.Is(err, errdefs.ErrNotFound) || errdefs.Message(err) != "no such file or directory: /missing" {
		t.Fatalf("missing: %v (%q)", err, errdefs.Message(err))
	}
	if _, _, err := f.OpenRead("/dir"); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "is a directory") {
		t.Fatalf("dir: %v", err)
	}
	if _, _, err := f.OpenRead("/"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("root: %v", err)
	}
	if _, _, err := f.OpenRead("relative"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("relative: %v", err)
	}
	if err := unix.Mknod(filepath.Join(root, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.OpenRead("/null"); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("device: %v", err)
	}
}

func TestFifoDoesNotBlock(t *testing.T) {
	f, root, _ := newFS(t)
	if err := unix.Mkfifo(filepath.Join(root, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	os.Symlink("/fifo", filepath.Join(root, "tofifo"))
	os.Mkdir(filepath.Join(root, "d"), 0o755)
	unix.Mkfifo(filepath.Join(root, "d/fifo"), 0o666)
	mustWrite(t, filepath.Join(root, "d/file"), "x", 0o644)
	done := make(chan error, 1)
	go func() {
		for _, p := range []string{"/fifo", "/tofifo"} {
			if _, _, err := f.OpenRead(p); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "not a regular file") {
				done <- err
				return
			}
		}
		done <- f.WriteTar("/d", io.Discard)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reading a fifo blocked")
	}
}

func TestStatList(t *testing.T) {
	f, root, _ := newFS(t)
	mustWrite(t, filepath.Join(root, "d/b.txt"), "12345", 0o600)
	mustWrite(t, filepath.Join(root, "d/a.txt"), "1", 0o644)
	os.Mkdir(filepath.Join(root, "d/sub"), 0o700)
	os.Symlink("/etc/passwd", filepath.Join(root, "d/link"))
	unix.Mkfifo(filepath.Join(root, "d/fifo"), 0o640)
	mtime := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	os.Chtimes(filepath.Join(root, "d/b.txt"), mtime, mtime)

	ents, err := f.List("/d")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name+":"+e.Type+":"+e.Mode+":"+e.LinkTarget)
	}
	want := "a.txt:file:0644:,b.txt:file:0600:,fifo:other:0640:,link:symlink:0777:/etc/passwd,sub:dir:0700:"
	if strings.Join(names, ",") != want {
		t.Fatalf("list:\n got %s\nwant %s", strings.Join(names, ","), want)
	}
	if ents[1].Path != "/d/b.txt" || ents[1].Size != 5 || !ents[1].MTime.Equal(mtime) {
		t.Fatalf("entry %+v", ents[1])
	}
	e, err := f.Stat("/d/link")
	if err != nil || e.Type != "symlink" || e.LinkTarget != "/etc/passwd" {
		t.Fatalf("stat link: %+v %v", e, err)
	}
	e, err = f.Stat("/")
	if err != nil || e.Type != "dir" || e.Name != "/" || e.Path != "/" {
		t.Fatalf("stat /: %+v %v", e, err)
	}
	if _, err := f.Stat("/d/nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat missing: %v", err)
	}
	if _, err := f.List("/d/a.txt"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("list file: %v", err)
	}
	if _, err := f.List("/nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("list missing: %v", err)
	}
	// List follows a symlink to a directory inside the root.
	os.Symlink("d", filepath.Join(root, "dl"))
	ents, err = f.List("/dl")
	if err != nil || len(ents) != 5 || ents[0].Path != "/dl/a.txt" {
		t.Fatalf("list via link: %v %v", ents, err)
	}
}

func TestMkdir(t *testing.T) {
	f, root, _ := newFS(t)
	if _, err := f.Mkdir("/x/y", false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing parent: %v", err)
	}
	e, err := f.Mkdir("/x", false)
	if err != nil || e.Type != "dir" || e.Mode != "0755" || e.Name != "x" {
		t.Fatalf("mkdir: %+v %v", e, err)
	}
	if _, err := f.Mkdir("/x", false); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("exists: %v", err)
	}
	if _, err := f.Mkdir("/x", true); err != nil {
		t.Fatalf("exists with parents: %v", err)
	}
	e, err = f.Mkdir("/x/p/q/r", true)
	if err != nil || e.Path != "/x/p/q/r" || e.Type != "dir" {
		t.Fatalf("parents: %+v %v", e, err)
	}
	for _, p := range []string{"x", "x/p", "x/p/q", "x/p/q/r"} {
		if u, g := owner(t, filepath.Join(root, p)); u != testUID || g != testGID {
			t.Errorf("%s owned by %d:%d", p, u, g)
		}
	}
	mustWrite(t, filepath.Join(root, "file"), "x", 0o644)
	if _, err := f.Mkdir("/file", true); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("file in the way: %v", err)
	}
	if _, err := f.Mkdir("/file/sub", true); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("file in the way of parent: %v", err)
	}
	if _, err := f.Mkdir("/", true); err != nil {
		t.Fatalf("mkdir -p /: %v", err)
	}
	if _, err := f.Mkdir("/", false); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("mkdir /: %v", err)
	}
}

func TestRemove(t *testing.T) {
	f, root, _ := newFS(t)
	mustWrite(t, filepath.Join(root, "d/e/f"), "x", 0o644)
	mustWrite(t, filepath.Join(root, "file"), "x", 0o644)
	os.Mkdir(filepath.Join(root, "empty"), 0o755)
	if err := f.Remove("/", true); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("remove /: %v", err)
	}
	if err := f.Remove("/nope", false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	if err := f.Remove("/d", false); !errors.Is(err, errdefs.ErrConflict) || errdefs.Message(err) != "directory not empty: /d" {
		t.Fatalf("non-empty: %v", err)
	}
	for _, p := range []string{"/file", "/empty"} {
		if err := f.Remove(p, false); err != nil {
			t.Fatal(err)
		}
	}
	unix.Mkfifo(filepath.Join(root, "d/e/fifo"), 0o644)
	if err := f.Remove("/d", true); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(root)
	if len(ents) != 0 {
		t.Fatalf("left: %v", ents)
	}
}

func TestCloseWhileInUse(t *testing.T) {
	f, _, _ := newFS(t)
	r, w := io.Pipe()
	done := make(chan error)
	go func() {
		_, err := f.Write("/slow", r, 0)
		done <- err
	}()
	w.Write([]byte("part1"))
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Stat("/"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("stat after close: %v", err)
	}
	w.Write([]byte("part2"))
	w.Close()
	if err := <-done; err != nil {
		t.Fatalf("write in flight during Close: %v", err)
	}
}

func TestCleanPath(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"/", "/", true},
		{"/a/b", "/a/b", true},
		{"/a/b/", "/a/b", true},
		{"//a//b", "/a/b", true},
		{"/a/./b/../c", "/a/c", true},
		{"/../../etc/passwd", "/etc/passwd", true},
		{"/..", "/", true},
		{"", "", false},
		{"a/b", "", false},
		{"./a", "", false},
		{"../a", "", false},
		{"/a\x00b", "", false},
		{"/" + strings.Repeat("a", 4095), "/" + strings.Repeat("a", 4095), true},
		{"/" + strings.Repeat("a", 4096), "", false},
	} {
		got, err := CleanPath(tc.in)
		if tc.ok {
			if err != nil || got != tc.want {
				t.Errorf("CleanPath(%.40q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		} else if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("CleanPath(%.40q) = %q, %v; want ErrInvalid", tc.in, got, err)
		}
	}
	if _, err := CleanPath("rel"); errdefs.Message(err) != "path must be absolute" {
		t.Errorf("message %q", errdefs.Message(err))
	}
}
