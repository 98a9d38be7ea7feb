package layertar

import (
	"archive/tar"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// Extract recreates under dir (which must exist) a tar made by Write: files, directories, symlinks, hard
// links, device nodes (mknod), fifos, ownership (lchown), modes (chmod after chown, so setuid bits stay),
// xattrs (including trusted.*), nanosecond mtimes (directories after their contents) and the "." entry's
// attributes on dir itself. An entry that already exists at a path is replaced (a directory is kept and its
// attributes are reset, including the removal of xattrs the tar does not list). A sparse file (typeSparse) is
// written as its data segments, its holes recreated as holes (never written as zeros). Entries whose names are
// absolute or contain "..", hard links whose targets are, and GNU sparse or unknown entry types are refused with
// errdefs.ErrInvalid, as is any path whose parent is a symlink: every parent is resolved beneath dir with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), so nothing is ever written outside dir or through a
// symlink. Extract does not fsync what it writes. On error, what was extracted so far stays.
func Extract(r io.Reader, dir string) (Stats, error) {
	rootfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("open %s: %w", dir, err)
	}
	x := &extractor{root: rootfd, cacheFD: -1, dirs: map[string]*tar.Header{}, buf: make([]byte, 1<<20)}
	defer x.close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if errors.Is(err, tar.ErrHeader) || errors.Is(err, tar.ErrInsecurePath) {
				return x.stats, fmt.Errorf("read tar: %w: %w", errdefs.ErrInvalid, err)
			}
			return x.stats, fmt.Errorf("read tar: %w", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return x.stats, err
		}
		x.stats.Entries++
	}
	if err := x.finish(); err != nil {
		return x.stats, err
	}
	return x.stats, nil
}

type extractor struct {
	root     int
	cacheRel string // the parent directory resolved last, kept open as cacheFD
	cacheFD  int
	dirs     map[string]*tar.Header // directories whose attributes are set at the end ("" is the root)
	stats    Stats
	buf      []byte
}

func (x *extractor) close() {
	x.dropCache()
	unix.Close(x.root)
}

func (x *extractor) dropCache() {
	if x.cacheFD >= 0 {
		unix.Close(x.cacheFD)
	}
	x.cacheRel, x.cacheFD = "", -1
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrInvalid, fmt.Sprintf(format, args...))
}

// cleanName validates a tar entry name (or hard link target) and returns it as a relative path without
// trailing slashes; "." (the root) is returned as "". Absolute names, names with a ".." component and names
// with NUL bytes are refused.
func cleanName(name string) (string, error) {
	if name == "" || strings.HasPrefix(name, "/") || strings.IndexByte(name, 0) >= 0 {
		return "", invalid("tar entry name %q", name)
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			return "", invalid("tar entry name %q", name)
		}
		parts = append(parts, p)
	}
	return path.Join(parts...), nil
}

func splitRel(rel string) (dir, name string) {
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		return rel[:i], rel[i+1:]
	}
	return "", rel
}

func (x *extractor) entry(hdr *tar.Header, tr io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeGNUSparse {
		return invalid("%q: sparse entries are not supported", hdr.Name)
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return invalid("%q: sparse entries are not supported", hdr.Name)
		}
	}
	if hdr.Uid < 0 || hdr.Uid >= math.MaxUint32 || hdr.Gid < 0 || hdr.Gid >= math.MaxUint32 {
		return invalid("%q: uid/gid %d/%d out of range", hdr.Name, hdr.Uid, hdr.Gid)
	}
	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return invalid("the root entry %q is not a directory", hdr.Name)
		}
		x.dirs[""] = hdr
		return nil
	}
	parentRel, name := splitRel(rel)
	pfd, err := x.parent(parentRel)
	if err != nil {
		return fmt.Errorf("%q: %w", hdr.Name, err)
	}
	// Replace what is there, unless a directory is to stay a directory.
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if !(isDir && hdr.Typeflag == tar.TypeDir) {
			if err := x.remove(pfd, name, rel, isDir); err != nil {
				return err
			}
			if pfd, err = x.parent(parentRel); err != nil {
				return fmt.Errorf("%q: %w", hdr.Name, err)
			}
		}
	} else if !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("lstat %q: %w", rel, err)
	}
	mode := uint32(hdr.Mode & 07777)
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeRegA, tar.TypeCont, typeSparse:
		return x.file(pfd, name, rel, hdr, tr)
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mkdir %q: %w", rel, err)
		}
		x.dirs[rel] = hdr
		return nil
	case tar.TypeSymlink:
		if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
			return invalid("%q: symlink target %q", hdr.Name, hdr.Linkname)
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, name); err != nil {
			return fmt.Errorf("symlink %q: %w", rel, err)
		}
		return x.attrs(pfd, name, rel, hdr, true)
	case tar.TypeLink:
		return x.link(pfd, name, rel, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if hdr.Devmajor < 0 || hdr.Devmajor > math.MaxUint32 || hdr.Devminor < 0 || hdr.Devminor > math.MaxUint32 {
			return invalid("%q: device %d:%d", hdr.Name, hdr.Devmajor, hdr.Devminor)
		}
		typ := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
		dev := int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))
		if hdr.Typeflag == tar.TypeFifo {
			dev = 0
		}
		if err := unix.Mknodat(pfd, name, typ|mode, dev); err != nil {
			return fmt.Errorf("mknod %q: %w", rel, err)
		}
		return x.attrs(pfd, name, rel, hdr, false)
	default:
		return invalid("%q: unsupported tar entry type %q", hdr.Name, hdr.Typeflag)
	}
}

// file creates a regular file and streams its content from tr.
func (x *extractor) file(pfd int, name, rel string, hdr *tar.Header, tr io.Reader) error {
	fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %q: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	var n int64
	if hdr.Typeflag == typeSparse {
		n, err = x.sparseContent(f, hdr, tr)
	} else {
		n, err = io.CopyBuffer(onlyWriter{f}, tr, x.buf)
	}
	if err != nil {
		return fmt.Errorf("write %q: %w", rel, err)
	}
	x.stats.Files++
	x.stats.Bytes += n
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown %q: %w", rel, err)
	}
	if err := setXattrs(fd, "", xattrRecords(hdr), false); err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode&07777)); err != nil {
		return fmt.Errorf("chmod %q: %w", rel, err)
	}
	if err := unix.UtimesNanoAt(pfd, name, times(hdr), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set mtime %q: %w", rel, err)
	}
	return f.Close()
}

// sparseContent writes the data segments of a typeSparse entry at their offsets in the new file f and sets
// its size: the holes between them are never written, so they stay holes. It returns the data bytes written.
// Records out of order, overlapping, past the file's size or past the entry's end are refused.
func (x *extractor) sparseContent(f *os.File, hdr *tar.Header, tr io.Reader) (int64, error) {
	size, err := strconv.ParseInt(hdr.PAXRecords[sparseSizeRecord], 10, 64)
	if err != nil || size < 0 {
		return 0, invalid("%q: sparse file size %q", hdr.Name, hdr.PAXRecords[sparseSizeRecord])
	}
	var rec [segmentRecordSize]byte
	var data, end int64 // data bytes written; the end of the last segment
	for left := hdr.Size; left > 0; {
		if left < segmentRecordSize {
			return data, invalid("%q: sparse entry ends inside a segment record", hdr.Name)
		}
		if _, err := io.ReadFull(tr, rec[:]); err != nil {
			return data, fmt.Errorf("read segment record: %w", err)
		}
		left -= segmentRecordSize
		off, n := binary.BigEndian.Uint64(rec[:8]), binary.BigEndian.Uint64(rec[8:])
		if n == 0 || off < uint64(end) || off > uint64(size) || n > uint64(size)-off || n > uint64(left) {
			return data, invalid("%q: sparse segment %d+%d (file size %d, after %d, %d bytes left in the entry)",
				hdr.Name, off, n, size, end, left)
		}
		c, err := io.CopyBuffer(io.NewOffsetWriter(f, int64(off)), io.LimitReader(tr, int64(n)), x.buf)
		data += c
		if err == nil && c != int64(n) {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return data, err
		}
		left -= int64(n)
		end = int64(off + n)
	}
	if err := f.Truncate(size); err != nil {
		return data, err
	}
	return data, nil
}

// onlyWriter hides *os.File's ReaderFrom so that io.CopyBuffer uses the given buffer.
type onlyWriter struct{ io.Writer }

// link creates a hard link to an earlier entry.
func (x *extractor) link(pfd int, name, rel string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("%q: hard link: %w", hdr.Name, err)
	}
	if target == "" {
		return invalid("%q: hard link to the root", hdr.Name)
	}
	tdir, tname := splitRel(target)
	tfd := x.root
	if tdir != "" {
		if tfd, err = x.openDir(tdir, false); err != nil {
			return fmt.Errorf("%q: hard link target %q: %w", hdr.Name, hdr.Linkname, err)
		}
		defer unix.Close(tfd)
	}
	// flags 0: a symlink target is linked itself, never followed.
	if err := unix.Linkat(tfd, tname, pfd, name, 0); err != nil {
		return fmt.Errorf("link %q to %q: %w", rel, target, err)
	}
	return nil
}

// attrs sets owner, xattrs, mode (not for symlinks) and mtime of the entry name in directory pfd.
func (x *extractor) attrs(pfd int, name, rel string, hdr *tar.Header, symlink bool) error {
	if err := unix.Fchownat(pfd, name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown %q: %w", rel, err)
	}
	if err := setXattrs(-1, procFD(pfd)+"/"+name, xattrRecords(hdr), false); err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	if !symlink {
		// The entry was just created by us and is not a symlink, so following is moot.
		if err := unix.Fchmodat(pfd, name, uint32(hdr.Mode&07777), 0); err != nil {
			return fmt.Errorf("chmod %q: %w", rel, err)
		}
	}
	if err := unix.UtimesNanoAt(pfd, name, times(hdr), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set mtime %q: %w", rel, err)
	}
	return nil
}

func times(hdr *tar.Header) []unix.Timespec {
	return []unix.Timespec{
		{Nsec: unix.UTIME_OMIT},
		unix.NsecToTimespec(hdr.ModTime.UnixNano()),
	}
}

// setXattrs sets the xattrs of fd (path == "") or path (not following a final symlink). With exact, xattrs
// that are not in want are removed (those of the security namespace only where the kernel lets us).
func setXattrs(fd int, path string, want map[string]string, exact bool) error {
	if exact {
		have, err := listXattrs(fd, path)
		if err != nil {
			return err
		}
		for k := range have {
			if _, ok := want[k]; ok {
				continue
			}
			var err error
			if path == "" {
				err = unix.Fremovexattr(fd, k)
			} else {
				err = unix.Lremovexattr(path, k)
			}
			if err != nil && !errors.Is(err, unix.ENODATA) && !strings.HasPrefix(k, "security.") {
				return fmt.Errorf("removexattr %s: %w", k, err)
			}
		}
	}
	// Deterministic order, so that errors are reproducible.
	names := make([]string, 0, len(want))
	for k := range want {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		var err error
		if path == "" {
			err = unix.Fsetxattr(fd, k, []byte(want[k]), 0)
		} else {
			err = unix.Lsetxattr(path, k, []byte(want[k]), 0)
		}
		if err != nil {
			return fmt.Errorf("setxattr %s: %w", k, err)
		}
	}
	return nil
}

// remove deletes the existing entry name (at rel) of directory pfd, and forgets what was known under it.
func (x *extractor) remove(pfd int, name, rel string, isDir bool) error {
	var err error
	if isDir {
		// os.RemoveAll works with openat/unlinkat and O_NOFOLLOW below the parent it opens, which is reached
		// through the descriptor we hold, not by a path from the root.
		err = os.RemoveAll(procFD(pfd) + "/" + name)
	} else {
		err = unix.Unlinkat(pfd, name, 0)
	}
	if err != nil {
		return fmt.Errorf("replace %q: %w", rel, err)
	}
	if isDir {
		for d := range x.dirs {
			if d == rel || strings.HasPrefix(d, rel+"/") {
				delete(x.dirs, d)
			}
		}
		if x.cacheFD >= 0 && (x.cacheRel == rel || strings.HasPrefix(x.cacheRel, rel+"/")) {
			x.dropCache()
		}
	}
	return nil
}

// parent returns a descriptor of directory rel (created if missing), cached until the next call.
func (x *extractor) parent(rel string) (int, error) {
	if rel == "" {
		return x.root, nil
	}
	if x.cacheFD >= 0 && x.cacheRel == rel {
		return x.cacheFD, nil
	}
	fd, err := x.openDir(rel, true)
	if err != nil {
		return -1, err
	}
	x.dropCache()
	x.cacheRel, x.cacheFD = rel, fd
	return fd, nil
}

// openDir opens directory rel beneath the root as an O_PATH descriptor, refusing symlinks anywhere on the
// way; with create, missing directories are made (mode 0755, owned by the caller).
func (x *extractor) openDir(rel string, create bool) (int, error) {
	how := &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	for range 16 {
		fd, err := unix.Openat2(x.root, rel, how)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOSYS) || (errors.Is(err, unix.ENOENT) && create):
			return x.walkDir(rel, create)
		case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV):
			return -1, invalid("%q is not a directory beneath the destination (symlink or other file on the way)", rel)
		default:
			return -1, fmt.Errorf("open %q: %w", rel, err)
		}
	}
	return -1, fmt.Errorf("open %q: %w", rel, unix.EAGAIN)
}

// walkDir is openDir one component at a time with O_NOFOLLOW (names never contain ".."), creating
// missing directories when asked to. It serves kernels without openat2, and creation.
func (x *extractor) walkDir(rel string, create bool) (int, error) {
	cur := x.root
	closeCur := func() {
		if cur != x.root {
			unix.Close(cur)
		}
	}
	for _, comp := range strings.Split(rel, "/") {
		flags := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		fd, err := unix.Openat(cur, comp, flags, 0)
		if errors.Is(err, unix.ENOENT) && create {
			if err := unix.Mkdirat(cur, comp, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				closeCur()
				return -1, fmt.Errorf("mkdir %q: %w", rel, err)
			}
			fd, err = unix.Openat(cur, comp, flags, 0)
		}
		if err != nil {
			closeCur()
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return -1, invalid("%q is not a directory beneath the destination (symlink or other file on the way)", rel)
			}
			return -1, fmt.Errorf("open %q: %w", rel, err)
		}
		// O_PATH|O_NOFOLLOW opens a symlink itself; make sure this is a directory.
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			unix.Close(fd)
			closeCur()
			return -1, invalid("%q is not a directory beneath the destination", rel)
		}
		closeCur()
		cur = fd
	}
	return cur, nil
}

// finish sets the attributes of directories, deepest first, so that creating their contents does not
// change their mtimes afterwards; the root comes last.
func (x *extractor) finish() error {
	x.dropCache()
	rels := make([]string, 0, len(x.dirs))
	for rel := range x.dirs {
		rels = append(rels, rel)
	}
	depth := func(rel string) int {
		if rel == "" {
			return -1
		}
		return strings.Count(rel, "/")
	}
	sort.Slice(rels, func(i, j int) bool {
		if di, dj := depth(rels[i]), depth(rels[j]); di != dj {
			return di > dj
		}
		return rels[i] < rels[j]
	})
	for _, rel := range rels {
		if err := x.dirAttrs(rel, x.dirs[rel]); err != nil {
			return err
		}
	}
	return nil
}

func (x *extractor) dirAttrs(rel string, hdr *tar.Header) error {
	fd := x.root
	if rel != "" {
		dir, name := splitRel(rel)
		pfd := x.root
		if dir != "" {
			var err error
			if pfd, err = x.openDir(dir, false); err != nil {
				return fmt.Errorf("%q: %w", rel, err)
			}
			defer unix.Close(pfd)
		}
		var err error
		fd, err = unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %q: %w", rel, err)
		}
		defer unix.Close(fd)
	}
	name := rel
	if name == "" {
		name = "."
	}
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown %q: %w", name, err)
	}
	if err := setXattrs(fd, "", xattrRecords(hdr), true); err != nil {
		return fmt.Errorf("%q: %w", name, err)
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode&07777)); err != nil {
		return fmt.Errorf("chmod %q: %w", name, err)
	}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, procFD(fd), times(hdr), 0); err != nil {
		return fmt.Errorf("set mtime %q: %w", name, err)
	}
	return nil
}
