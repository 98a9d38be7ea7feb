package files

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// The archive upload (PUT /files/archive) hands ExtractTar bytes straight from the API client. The fuzz targets
// below extract arbitrary archives into a fresh root that holds planted symlinks (absolute, relative, to the
// host directory next to the root), a pre-existing file and directory, and check after every input:
//   - nothing outside the root changed (outsideFixture), and nothing new appeared in the root except below the
//     destination or where the planted symlinks lead (so the archive never went through its own symlinks);
//   - everything new is a regular file, directory or symlink (no device, fifo or socket) owned by the FS's
//     uid/gid, and no temporary file is left behind;
//   - an error is one of the API's client errors (errdefs kinds: a 4xx, never a 500 for a bad archive);
//   - on success, every entry's final state is there: the last entry to land on a path decides its type,
//     content, link target and mode.
// FuzzExtractTar mutates raw archive bytes (header parsing, truncation, PAX/GNU records); FuzzExtractTarEntries
// builds well-formed archives from a small text script so that the fuzzer explores entry sequences rather than
// checksums.

// fuzzEntry is one archive entry the check knows about (nil entries: only the raw bytes are known).
type fuzzEntry struct {
	typ        byte
	name, link string
	body       string
	mode       int64
}

// plantedRoot builds the root the archives land in and returns the FS, the root's path, the areas (host paths)
// where new files may appear, and a check that nothing outside the root changed.
func plantedRoot(t *testing.T) (*FS, string, []string, func()) {
	t.Helper()
	requireRoot(t)
	base := t.TempDir()
	root := filepath.Join(base, "root")
	out, check := outsideFixture(t, base)
	mustWrite(t, filepath.Join(root, "dest/file"), "old", 0o644)
	for _, d := range []string{"dest/dir", "elsewhere", "outside"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"dest/planted-abs":  "/elsewhere",
		"dest/planted-rel":  "../../../outside",
		"dest/planted-host": out,
		"dest/planted-file": "/elsewhere/f",
		"dest/dir/up":       "..",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	fsys, err := Open(root, testUID, testGID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fsys.Close() })
	allowed := []string{
		filepath.Join(root, "dest"), filepath.Join(root, "elsewhere"), filepath.Join(root, "outside"),
		filepath.Join(root, out), // the host path the absolute link names, resolved inside the root
	}
	return fsys, root, allowed, check
}

func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

func buildTar(entries []fuzzEntry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Typeflag: e.typ, Name: e.name, Linkname: e.link, Mode: e.mode,
			ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if e.typ == tar.TypeReg || e.typ == tar.TypeRegA { //nolint:staticcheck // old-style files carry a body too
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// checkExtract extracts archive into a planted root at /dest and checks the properties above. entries, if not
// nil, are the archive's entries (for the success check).
func checkExtract(t *testing.T, archive []byte, entries []fuzzEntry) {
	fsys, root, allowed, check := plantedRoot(t)
	before := map[string]bool{}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		before[p] = true
		return nil
	})
	_, xerr := fsys.ExtractTar("/dest", bytes.NewReader(archive))
	check()
	if xerr == nil && expands(archive) {
		t.Errorf("extracted an archive of %d bytes that declares more content than it holds (sparse expansion)", len(archive))
	}
	if xerr != nil {
		client := false
		for _, kind := range []error{errdefs.ErrInvalid, errdefs.ErrConflict, errdefs.ErrNotFound, errdefs.ErrTooLarge} {
			client = client || errors.Is(xerr, kind)
		}
		if !client {
			t.Errorf("extract failed with an error that is not a client error (the API answers 500): %v", xerr)
		}
	}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || before[p] {
			return nil
		}
		ok := false
		for _, a := range allowed {
			// below an allowed area, or a directory on the way to one (made for the host-path link)
			ok = ok || under(p, a) || (fi.IsDir() && strings.HasPrefix(a, p+"/"))
		}
		if !ok {
			t.Errorf("extract created %s, outside the destination and the planted links' targets", p)
		}
		if m := fi.Mode(); !m.IsRegular() && !m.IsDir() && m&os.ModeSymlink == 0 {
			t.Errorf("extract created %s with mode %v (a device, fifo or socket)", p, m)
		}
		if u, g := owner(t, p); u != testUID || g != testGID {
			t.Errorf("extract created %s owned by %d:%d", p, u, g)
		}
		if strings.HasPrefix(fi.Name(), ".ramify-") && strings.HasSuffix(fi.Name(), ".tmp") {
			t.Errorf("extract left the temporary file %s", p)
		}
		return nil
	})
	if xerr != nil || entries == nil {
		return
	}
	checkApplied(t, fsys, entries)
}

// checkApplied checks that after a successful extraction the last entry to land on each path decided it.
func checkApplied(t *testing.T, fsys *FS, entries []fuzzEntry) {
	rootfd, err := fsys.acquire()
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.release()
	type landed struct {
		i   int
		rel string
	}
	last := map[string]landed{} // the host path an entry resolves to now -> the last entry that resolves there
	var order []string
	rels := make([]string, len(entries))
	for i := range entries {
		e := &entries[i]
		if e.typ == tar.TypeRegA { //nolint:staticcheck // archive/tar reads this old type as a file or, named "x/", a directory
			e.typ = tar.TypeReg
			if strings.HasSuffix(e.name, "/") {
				e.typ = tar.TypeDir
			}
		}
		rel, err := entryName(e.name)
		if err != nil || rel == "" {
			continue
		}
		rels[i] = rel
		switch e.typ {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
		default:
			continue
		}
		dirfd, name, err := openParent(rootfd, path.Join("/dest", rel))
		if err != nil {
			continue // its parent was replaced by a later entry (checked below through that entry)
		}
		key := realPath(t, dirfd) + "/" + name
		unix.Close(dirfd)
		if _, seen := last[key]; !seen {
			order = append(order, key)
		}
		last[key] = landed{i, rel}
	}
	for _, key := range order {
		l := last[key]
		e := entries[l.i]
		// A later directory entry may have replaced a symlink on this entry's way: it then resolves elsewhere.
		moved := false
		for j := l.i + 1; j < len(entries); j++ {
			if entries[j].typ == tar.TypeDir && rels[j] != "" && strings.HasPrefix(l.rel, rels[j]+"/") {
				moved = true
			}
		}
		var st unix.Stat_t
		if err := unix.Lstat(key, &st); err != nil {
			if !moved {
				t.Errorf("entry %q (%c) extracted without error but %s is missing: %v", e.name, e.typ, key, err)
			}
			continue
		}
		typ := st.Mode & unix.S_IFMT
		switch e.typ {
		case tar.TypeReg:
			b, err := os.ReadFile(key)
			if typ != unix.S_IFREG || err != nil || string(b) != e.body {
				t.Errorf("entry %q: %s holds %d bytes %.64q (type %o, %v), want %d bytes %.64q", e.name, key, len(b), b, typ, err, len(e.body), e.body)
			}
			if st.Mode&0o777 != uint32(e.mode)&0o777 {
				t.Errorf("entry %q: %s has mode %o, want %o", e.name, key, st.Mode&0o777, e.mode&0o777)
			}
		case tar.TypeDir:
			if typ != unix.S_IFDIR {
				t.Errorf("entry %q: %s is not a directory (type %o)", e.name, key, typ)
			}
		case tar.TypeSymlink:
			if target, err := os.Readlink(key); typ != unix.S_IFLNK || err != nil || target != e.link {
				t.Errorf("entry %q: %s links to %q (type %o, %v), want %q", e.name, key, target, typ, err, e.link)
			}
		}
	}
}

// parseScript turns a fuzz script into entries: one entry per line, "<type><name>|<link>|<body>|<octal mode>",
// where the type is a tar type flag byte ('0' file, '5' dir, '2' symlink, '1' hard link, '3' char device, '6'
// fifo, ...) and "OUT" in a name or link stands for the host directory next to the root.
func parseScript(s, out string) []fuzzEntry {
	var entries []fuzzEntry
	for _, line := range strings.Split(s, "\n") {
		if line == "" || len(entries) >= 32 {
			continue
		}
		f := strings.SplitN(line[1:], "|", 4)
		for len(f) < 4 {
			f = append(f, "")
		}
		mode, err := strconv.ParseInt(f[3], 8, 64)
		if err != nil || mode < 0 || mode > 0o7777 {
			mode = 0o644
		}
		entries = append(entries, fuzzEntry{typ: line[0], name: strings.ReplaceAll(f[0], "OUT", out),
			link: strings.ReplaceAll(f[1], "OUT", out), body: f[2], mode: mode})
	}
	return entries
}

// tarScripts are the seeds of both targets: the attacks TestExtractMalicious knows, and ordinary archives.
var tarScripts = []string{
	"0a.txt|||644\n5d/||||755\n0d/b|||700\n2l|a.txt\n1h|a.txt",
	"0../x||pwned",
	"0a/../../../outside/secret||pwned",
	"0/abs||pwned",
	"0OUT/secret||pwned",
	"2a|/etc\n0a/passwd||pwned",
	"2a|OUT\n0a/secret||pwned",
	"5d/\n2d/up|../../../../outside\n0d/up/secret||pwned",
	"2a|OUT\n5a/sub/||777",
	"2a|OUT\n1h|a/secret",
	"2a|/etc\n1b|a\n0b/passwd||pwned",
	"1h|../outside/secret",
	"1h|OUT/secret",
	"2l|OUT/secret",
	"2a|OUT\n5a/\n0a/secret||fine",
	"0f||data\n1h|f",
	"0planted-abs/new||clamped\n0planted-rel/x||clamped\n0planted-host/y||clamped\n0planted-file||replaced",
	"5planted-abs/\n0planted-abs/z||z",
	"0dir/up/file||through a planted link to the destination",
	"3dev\n4blk\n6fifo\n0ok||ok",
	"0file||new\n5file/\n0file/x||x",
	"5a/\n0a/b||b\n0a||x",
	"2a|b\n0a||x\n2a|c",
	"0.||x",
	"5./\n0x||x",
	"0" + strings.Repeat("n", 300) + "||long",
	"0" + strings.Repeat("d/", 2100) + "f||deep",
	"2a|\n",
	"0a\x00b||nul",
	"xglobal|||",
}

func FuzzExtractTarEntries(f *testing.F) {
	for _, s := range tarScripts {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, script string) {
		requireRoot(t)
		// "OUT" names the host directory next to the root; its path is only known per run.
		base := t.TempDir()
		entries := parseScript(script, filepath.Join(base, "outside"))
		archive, err := buildTar(entries)
		if err != nil {
			return // archive/tar cannot write it: no client can send it either
		}
		checkExtract(t, archive, entries)
	})
}

func FuzzExtractTar(f *testing.F) {
	for _, s := range tarScripts {
		archive, err := buildTar(parseScript(s, "/tmp/outside"))
		if err != nil {
			continue
		}
		f.Add(archive)
		f.Add(archive[:len(archive)/2]) // truncated
	}
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0}, 1024))
	f.Add(sparseBomb(64 << 20))
	f.Fuzz(func(t *testing.T, archive []byte) {
		requireRoot(t)
		if len(archive) > 1<<20 {
			return
		}
		checkExtract(t, archive, entriesOf(archive))
	})
}

// entriesOf reads archive with archive/tar and returns its entries, or nil if it is not a complete archive.
func entriesOf(archive []byte) []fuzzEntry {
	tr := tar.NewReader(bytes.NewReader(archive))
	var entries []fuzzEntry
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return entries
		}
		if err != nil {
			return nil
		}
		b, err := io.ReadAll(io.LimitReader(tr, 1<<20))
		if err != nil {
			return nil
		}
		entries = append(entries, fuzzEntry{typ: h.Typeflag, name: h.Name, link: h.Linkname, body: string(b), mode: h.Mode})
	}
}

// expands reports whether an entry of archive declares more content than the whole archive holds: only a sparse
// entry can (its holes read as zeros).
func expands(archive []byte) bool {
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err != nil {
			return false
		}
		if h.Size > int64(len(archive)) {
			return true
		}
	}
}

// sparseBomb is a 3 KiB archive whose one entry (a GNU PAX 1.0 sparse file, a single hole) reads as size zero
// bytes: archive/tar writes no sparse entries, so its headers are made here.
func sparseBomb(size int64) []byte {
	rec := func(k, v string) string {
		line := " " + k + "=" + v + "\n"
		n := len(line) + 1
		for len(strconv.Itoa(n))+len(line) != n {
			n++
		}
		return strconv.Itoa(n) + line
	}
	pax := rec("GNU.sparse.major", "1") + rec("GNU.sparse.minor", "0") + rec("GNU.sparse.name", "big") +
		rec("GNU.sparse.realsize", strconv.FormatInt(size, 10))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "pax", Size: int64(len(pax)), Mode: 0o644, Format: tar.FormatUSTAR})
	tw.Write([]byte(pax))
	sparseMap := make([]byte, 512) // one data region of length 0 at offset 0: the rest is a hole
	copy(sparseMap, "1\n0\n0\n")
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "GNUSparseFile.0/big", Size: 512, Mode: 0o644, Format: tar.FormatUSTAR})
	tw.Write(sparseMap)
	tw.Close()
	b := buf.Bytes()
	// Make the first header a PAX extended header and fix its checksum.
	b[156] = tar.TypeXHeader
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b[:512] {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}
