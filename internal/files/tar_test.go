package files

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// snapshot describes a tree: relative name → type, mode, content or link target, mtime (files, seconds).
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(dir, p)
		if r == "." {
			return nil
		}
		var desc string
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc = "link " + target
		case fi.IsDir():
			desc = fmt.Sprintf("dir %v", fi.Mode())
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			desc = fmt.Sprintf("file %v %d %q", fi.Mode(), fi.ModTime().Unix(), b)
		default:
			desc = "other"
		}
		m[r] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestTarRoundTrip(t *testing.T) {
	src, sroot, _ := newFS(t)
	dst, droot, _ := newFS(t)
	tree := filepath.Join(sroot, "home/u")
	mustWrite(t, filepath.Join(tree, "a.txt"), "hello", 0o644)
	mustWrite(t, filepath.Join(tree, "bin.dat"), "\x00\x01\x02\xff", 0o600)
	mustWrite(t, filepath.Join(tree, "sub/deeper/x.sh"), "#!/bin/sh\n", 0o755)
	mustWrite(t, filepath.Join(tree, "sub/suid"), "s", 0o644)
	os.Chmod(filepath.Join(tree, "sub/suid"), 0o4755|fs.ModeSetuid)
	mustWrite(t, filepath.Join(tree, strings.Repeat("long", 40)+"/"+strings.Repeat("name", 30)), "long", 0o644)
	os.Mkdir(filepath.Join(tree, "empty"), 0o700)
	os.Symlink("a.txt", filepath.Join(tree, "rel-link"))
	os.Symlink("/etc/passwd", filepath.Join(tree, "abs-link"))
	os.Symlink("../../nowhere", filepath.Join(tree, "sub/dangling"))
	unix.Mkfifo(filepath.Join(tree, "fifo"), 0o644)
	unix.Mknod(filepath.Join(tree, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	old := time.Date(2020, 5, 6, 7, 8, 9, 0, time.UTC)
	os.Chtimes(filepath.Join(tree, "a.txt"), old, old)
	os.Chmod(filepath.Join(tree, "sub/deeper"), 0o750)

	var buf bytes.Buffer
	if err := src.WriteTar("/home/u", &buf); err != nil {
		t.Fatal(err)
	}
	// Names are relative; specials are skipped.
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(h.Name, "/") || strings.HasPrefix(h.Name, "home") || h.Name == "fifo" || h.Name == "null" {
			t.Errorf("unexpected entry %q", h.Name)
		}
	}
	n, err := dst.ExtractTar("/restore/here", bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 {
		t.Errorf("extracted %d files, want 5", n)
	}
	want := snapshot(t, tree)
	delete(want, "fifo")
	delete(want, "null")
	got := snapshot(t, filepath.Join(droot, "restore/here"))
	if fmt.Sprint(want) != fmt.Sprint(got) {
		keys := func(m map[string]string) []string {
			var k []string
			for n, v := range m {
				k = append(k, n+": "+v)
			}
			sort.Strings(k)
			return k
		}
		t.Fatalf("round trip differs:\n got %s\nwant %s", strings.Join(keys(got), "\n     "), strings.Join(keys(want), "\n     "))
	}
	// Ownership of everything created.
	filepath.Walk(filepath.Join(droot, "restore"), func(p string, fi os.FileInfo, err error) error {
		if u, g := owner(t, p); u != testUID || g != testGID {
			t.Errorf("%s owned by %d:%d", p, u, g)
		}
		return nil
	})
	// Directory mtimes are restored too.
	sfi, _ := os.Stat(filepath.Join(tree, "sub"))
	dfi, _ := os.Stat(filepath.Join(droot, "restore/here/sub"))
	if sfi.ModTime().Unix() != dfi.ModTime().Unix() {
		t.Errorf("dir mtime %v, want %v", dfi.ModTime(), sfi.ModTime())
	}
	// Errors.
	if err := src.WriteTar("/home/u/a.txt", io.Discard); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("tar of a file: %v", err)
	}
	if err := src.WriteTar("/nope", io.Discard); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("tar of missing: %v", err)
	}
	if _, err := dst.ExtractTar("/bad", strings.NewReader(strings.Repeat("garbage!", 100))); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("garbage tar: %v", err)
	}
}

type tarEntry struct {
	name, link, body string
	typ              byte
	mode             int64
}

func makeTar(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: mode, Size: int64(len(e.body)),
			ModTime: time.Unix(1700000000, 0)}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

func TestExtractMalicious(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []tarEntry
		ok      bool // extraction succeeds (but must still stay inside)
	}{
		{"dotdot", []tarEntry{{name: "../x", typ: tar.TypeReg, body: "pwned"}}, false},
		{"dotdot-deep", []tarEntry{{name: "a/../../../outside/secret", typ: tar.TypeReg, body: "pwned"}}, false},
		{"absolute", []tarEntry{{name: "/abs", typ: tar.TypeReg, body: "pwned"}}, false},
		{"absolute-outside", []tarEntry{{name: "/OUT/secret", typ: tar.TypeReg, body: "pwned"}}, false},
		{"symlink-then-file", []tarEntry{
			{name: "a", typ: tar.TypeSymlink, link: "/etc"},
			{name: "a/passwd", typ: tar.TypeReg, body: "pwned"},
		}, false},
		{"symlink-outside-then-file", []tarEntry{
			{name: "a", typ: tar.TypeSymlink, link: "OUT"},
			{name: "a/secret", typ: tar.TypeReg, body: "pwned"},
		}, false},
		{"symlink-rel-then-file", []tarEntry{
			{name: "d/", typ: tar.TypeDir, mode: 0o755},
			{name: "d/up", typ: tar.TypeSymlink, link: "../../../../outside"},
			{name: "d/up/secret", typ: tar.TypeReg, body: "pwned"},
		}, false},
		{"symlink-then-dir", []tarEntry{
			{name: "a", typ: tar.TypeSymlink, link: "OUT"},
			{name: "a/sub/", typ: tar.TypeDir, mode: 0o777},
		}, false},
		{"symlink-then-hardlink-through", []tarEntry{
			{name: "a", typ: tar.TypeSymlink, link: "OUT"},
			{name: "h", typ: tar.TypeLink, link: "a/secret"},
		}, false},
		{"hardlink-to-symlink-then-file", []tarEntry{
			{name: "a", typ: tar.TypeSymlink, link: "/etc"},
			{name: "b", typ: tar.TypeLink, link: "a"},
			{name: "b/passwd", typ: tar.TypeReg, body: "pwned"},
		}, false},
		{"hardlink-dotdot", []tarEntry{{name: "h", typ: tar.TypeLink, link: "../outside/secret"}}, false},
		{"hardlink-abs", []tarEntry{{name: "h", typ: tar.TypeLink, link: "OUT/secret"}}, false},
		{"hardlink-dotdot-deep", []tarEntry{{name: "h", typ: tar.TypeLink, link: "../../../../../../OUT/secret"}}, false},
		// Symlinks themselves may point anywhere: they resolve inside the root when used.
		{"symlink-only", []tarEntry{{name: "l", typ: tar.TypeSymlink, link: "OUT/secret"}}, true},
		// A symlink replaced by a directory entry can be used as a directory afterwards.
		{"symlink-replaced-by-dir", []tarEntry{
			{name: "a", typ: tar.TypeSymlink, link: "OUT"},
			{name: "a/", typ: tar.TypeDir, mode: 0o755},
			{name: "a/secret", typ: tar.TypeReg, body: "fine"},
		}, true},
		{"hardlink-inside", []tarEntry{
			{name: "f", typ: tar.TypeReg, body: "data"},
			{name: "h", typ: tar.TypeLink, link: "f"},
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, root, base := newFS(t)
			out, check := outsideFixture(t, base)
			defer check()
			// A symlink to outside planted by the sandbox in the destination beforehand.
			os.MkdirAll(filepath.Join(root, "dest"), 0o755)
			os.Symlink(out, filepath.Join(root, "dest/planted"))
			for i := range tc.entries {
				tc.entries[i].name = strings.ReplaceAll(tc.entries[i].name, "OUT", out)
				tc.entries[i].link = strings.ReplaceAll(tc.entries[i].link, "OUT", out)
			}
			_, err := f.ExtractTar("/dest", bytes.NewReader(makeTar(t, tc.entries...)))
			if tc.ok && err != nil {
				t.Fatal(err)
			}
			if !tc.ok && !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("want ErrInvalid, got %v", err)
			}
			if _, err := os.Stat(filepath.Join(root, "etc/passwd")); err == nil {
				t.Errorf("wrote through the archive's symlink into the root's /etc")
			}
			filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
				if err == nil && fi.Mode().IsRegular() {
					if b, _ := os.ReadFile(p); string(b) == "pwned" || string(b) == "host secret" {
						t.Errorf("%s holds %q", p, b)
					}
				}
				return nil
			})
		})
	}
}

func TestExtractOverPlanted(t *testing.T) {
	f, root, base := newFS(t)
	out, check := outsideFixture(t, base)
	defer check()
	dest := filepath.Join(root, "dest")
	os.MkdirAll(dest, 0o755)
	os.MkdirAll(filepath.Join(root, out), 0o755)
	os.MkdirAll(filepath.Join(root, "outside"), 0o755)
	// Sandbox-planted symlinks in the destination: followed inside the root only, or replaced.
	os.Symlink(out, filepath.Join(dest, "planted-dir"))
	os.Symlink(filepath.Join(out, "secret"), filepath.Join(dest, "planted-file"))
	os.Symlink("../../outside", filepath.Join(dest, "planted-rel"))
	os.Symlink(out, filepath.Join(dest, "to-be-dir"))
	n, err := f.ExtractTar("/dest", bytes.NewReader(makeTar(t,
		tarEntry{name: "planted-dir/new", typ: tar.TypeReg, body: "clamped"},
		tarEntry{name: "planted-file", typ: tar.TypeReg, body: "replaced"},
		tarEntry{name: "planted-rel/x", typ: tar.TypeReg, body: "clamped"},
		tarEntry{name: "to-be-dir/", typ: tar.TypeDir, mode: 0o755},
		tarEntry{name: "to-be-dir/y", typ: tar.TypeReg, body: "y"},
		tarEntry{name: "fifo", typ: tar.TypeFifo},
		tarEntry{name: "dev", typ: tar.TypeChar},
	)))
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Errorf("files %d", n)
	}
	for p, want := range map[string]string{
		filepath.Join(root, out, "new"):     "clamped",
		filepath.Join(dest, "planted-file"): "replaced",
		filepath.Join(root, "outside/x"):    "clamped",
		filepath.Join(dest, "to-be-dir/y"):  "y",
	} {
		if b, err := os.ReadFile(p); err != nil || string(b) != want {
			t.Errorf("%s: %q %v", p, b, err)
		}
	}
	for _, p := range []string{"fifo", "dev"} {
		if _, err := os.Lstat(filepath.Join(dest, p)); err == nil {
			t.Errorf("%s was created", p)
		}
	}
}
