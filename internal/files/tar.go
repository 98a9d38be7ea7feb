package files

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// WriteTar streams a tar archive of the contents of the directory p to w. Names are relative to p (the
// directory itself is not an entry). Regular files, directories and symlinks are archived with their mode bits
// and modification times (whole seconds); symlink targets are stored as they are and never followed. Sockets,
// fifos, devices and kernel pseudo file systems (a procfs mounted inside, say) are skipped. A symlink at p
// itself is followed inside the root.
func (f *FS) WriteTar(p string, w io.Writer) error {
	a, err := f.OpenArchive(p)
	if err != nil {
		return err
	}
	defer a.Close()
	return a.Write(w)
}

// Archive is a directory opened for WriteTar. Opening it does every check that can refuse the archive (the path,
// kernel file systems, not a directory, missing), so that a caller can answer an error before it starts a
// response.
type Archive struct {
	f  *FS
	fd int
	p  string
}

// OpenArchive opens the directory p for archiving; Close releases it.
func (f *FS) OpenArchive(p string) (*Archive, error) {
	p, err := CleanPath(p)
	if err != nil {
		return nil, err
	}
	if err := refusePseudoRead("archive", p); err != nil {
		return nil, err
	}
	root, err := f.acquire()
	if err != nil {
		return nil, err
	}
	fd, err := openDir(root, p)
	if err != nil {
		f.release()
		return nil, wrap("archive", p, err)
	}
	return &Archive{f: f, fd: fd, p: p}, nil
}

// Write streams the tar archive of the directory's contents to w.
func (a *Archive) Write(w io.Writer) error {
	tw := tar.NewWriter(w)
	if err := writeTarDir(tw, a.fd, "", a.p); err != nil {
		return wrap("archive", a.p, err)
	}
	if err := tw.Close(); err != nil {
		return wrap("archive", a.p, err)
	}
	return nil
}

// Close releases the directory.
func (a *Archive) Close() error {
	err := unix.Close(a.fd)
	a.f.release()
	return err
}

func tarHeader(name string, st *unix.Stat_t) *tar.Header {
	return &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 07777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Sec, 0),
	}
}

// writeTarDir archives the entries of the directory open as fd, named with prefix.
func writeTarDir(tw *tar.Writer, fd int, prefix, p string) error {
	names, err := ReadNames(fd)
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if err == unix.ENOENT {
				continue
			}
			return err
		}
		name := prefix + n
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := writeTarSubdir(tw, fd, n, name, p); err != nil {
				return err
			}
		case unix.S_IFLNK:
			target, err := readlinkAt(fd, n)
			if err != nil {
				if err == unix.ENOENT || err == unix.EINVAL {
					continue // removed or swapped meanwhile
				}
				return err
			}
			h := tarHeader(name, &st)
			h.Typeflag = tar.TypeSymlink
			h.Linkname = target
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		case unix.S_IFREG:
			if err := writeTarFile(tw, fd, n, name); err != nil {
				return err
			}
		}
	}
	return nil
}

func writeTarSubdir(tw *tar.Writer, parent int, n, name, p string) error {
	fd, err := openat2(parent, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, beneath)
	if err != nil {
		if err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP {
			return nil // swapped meanwhile
		}
		return err
	}
	defer unix.Close(fd)
	if pseudoFS(fd) {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	h := tarHeader(name+"/", &st)
	h.Typeflag = tar.TypeDir
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	return writeTarDir(tw, fd, name+"/", p)
}

func writeTarFile(tw *tar.Writer, parent int, n, name string) error {
	pfd, err := openat2(parent, n, unix.O_PATH|unix.O_NOFOLLOW, 0, beneath)
	if err != nil {
		if err == unix.ENOENT {
			return nil
		}
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		unix.Close(pfd)
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(pfd)
		return nil // swapped meanwhile
	}
	fd, err := reopenRegular(pfd, &st, func() (int, error) {
		return openat2(parent, n, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_NOFOLLOW, 0, beneath)
	})
	unix.Close(pfd)
	if err != nil {
		if err == unix.EAGAIN || errors.Is(err, errdefs.ErrInvalid) {
			return nil // swapped meanwhile, or a pseudo file
		}
		return err
	}
	defer unix.Close(fd)
	h := tarHeader(name, &st)
	h.Typeflag = tar.TypeReg
	h.Size = st.Size
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	// Copy exactly Size bytes: a file that shrinks meanwhile is padded with zeros, one that grows is cut.
	written, err := io.Copy(tw, io.LimitReader(fdReader(fd), st.Size))
	if err != nil {
		return err
	}
	if written < st.Size {
		_, err = io.CopyN(tw, zeroReader{}, st.Size-written)
	}
	return err
}

type fdReader int

func (r fdReader) Read(b []byte) (int, error) {
	for {
		n, err := unix.Read(int(r), b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 && len(b) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// ExtractTar extracts the tar stream r under the directory p (created with its parents if needed) and returns
// the number of regular files written (hard links to regular files included).
//
// Entry names must stay below p: absolute names and names whose `..` would leave p are errdefs.ErrInvalid.
// Every entry is resolved inside the sandbox root; existing symlinks in its parent path are followed within
// the root, but an entry whose path goes through a symlink created by this same archive is errdefs.ErrInvalid,
// so an archive can never write through its own links. Symlinks are created as they are (their targets are not
// checked; they resolve inside the root when used). Hard links must name a target inside p. Regular files,
// symlinks and hard links replace what is in their way (files atomically); directories are merged. Everything
// created is owned by the FS's uid/gid and gets the entry's mode bits and modification time. Fifos, devices and
// other entry types are skipped. Size limits are the caller's.
//
// Extraction is all or nothing: every change is recorded as it is made (a file or link that an entry replaces
// is kept under a temporary hard link next to it, a directory's old mode is noted), and an error undoes the
// changes made so far, newest first, before it is returned. Entries, parents and the destination under /proc,
// /sys or /dev are refused (errdefs.ErrInvalid).
func (f *FS) ExtractTar(p string, r io.Reader) (int, error) {
	p, err := CleanPath(p)
	if err != nil {
		return 0, err
	}
	if err := refuseProtected("extract", p); err != nil {
		return 0, err
	}
	root, err := f.acquire()
	if err != nil {
		return 0, err
	}
	defer f.release()
	x := extractor{f: f, root: root, dest: p, links: map[string]bool{}}
	n, err := x.extract(r)
	if err != nil {
		x.rollback()
		return 0, err
	}
	x.commit()
	return n, nil
}

// extract does ExtractTar's work, recording in x.undo what it changes.
func (x *extractor) extract(r io.Reader) (int, error) {
	p := x.dest
	dfd, err := x.f.mkdirAllNoting(x.root, p, x.noteCreated)
	if err != nil {
		return 0, wrap("extract", p, err)
	}
	unix.Close(dfd)

	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) ||
				errors.Is(err, tar.ErrFieldTooLong) || errors.Is(err, tar.ErrInsecurePath) {
				err = errdefs.New(errdefs.ErrInvalid, "invalid tar archive: "+err.Error())
			}
			return x.files, wrap("extract", p, err)
		}
		if err := x.entry(h, tr); err != nil {
			return x.files, err
		}
	}
	if err := x.finishDirs(); err != nil {
		return x.files, err
	}
	return x.files, nil
}

type extractor struct {
	f     *FS
	root  int
	dest  string
	links map[string]bool // names (relative to dest) of symlinks this archive created
	dirs  []dirTime
	files int
	undo  []undoStep // what the extraction changed, oldest first
}

// undoStep is one change of an extraction, as rollback reverts it: path (absolute inside the root) was created
// (backup == "" and !chmod), or replaced while its old version was kept as backup (a name in the same
// directory), or is a directory whose mode was mode before (chmod).
type undoStep struct {
	path   string
	backup string
	chmod  bool
	mode   uint32
}

func (x *extractor) noteCreated(p string) { x.undo = append(x.undo, undoStep{path: p}) }

// preserve records what a change of name in dirfd (full path full) is about to replace: nothing (the change
// creates it), or a non-directory, which is kept under a hard link (for a symlink, the link itself) until the
// extraction commits. A directory in the way is left to the change, which refuses it.
func (x *extractor) preserve(dirfd int, name, full string) error {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == unix.ENOENT {
		x.noteCreated(full)
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil
	}
	var backup string
	for i := 0; i < 16; i++ {
		backup = tmpName()
		if err = unix.Linkat(dirfd, name, dirfd, backup, 0); err != unix.EEXIST {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("keep the old %s: %w", full, err)
	}
	x.undo = append(x.undo, undoStep{path: full, backup: backup})
	return nil
}

// rollback reverts the recorded changes, newest first. It is best effort: the sandbox may have changed the
// same files meanwhile.
func (x *extractor) rollback() {
	for i := len(x.undo) - 1; i >= 0; i-- {
		u := x.undo[i]
		dirfd, name, err := openParent(x.root, u.path)
		if err != nil {
			continue
		}
		switch {
		case u.chmod:
			if fd, err := openat2(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, beneath); err == nil {
				unix.Fchmod(fd, u.mode)
				unix.Close(fd)
			}
		case u.backup != "":
			var st, bst unix.Stat_t
			cur := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
			if cur == nil && unix.Fstatat(dirfd, u.backup, &bst, unix.AT_SYMLINK_NOFOLLOW) == nil &&
				st.Dev == bst.Dev && st.Ino == bst.Ino {
				// Never replaced (the change failed): a rename between two links of one file does nothing,
				// which would leave the backup behind.
				unix.Unlinkat(dirfd, u.backup, 0)
				break
			}
			if cur == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR) // a directory entry replaced the file: empty by now
			}
			if unix.Renameat(dirfd, u.backup, dirfd, name) != nil {
				unix.Unlinkat(dirfd, u.backup, 0)
			}
		default:
			if err := unix.Unlinkat(dirfd, name, 0); err == unix.EISDIR {
				unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
			}
		}
		unix.Close(dirfd)
	}
	x.undo = nil
}

// commit drops the backups of a successful extraction.
func (x *extractor) commit() {
	for _, u := range x.undo {
		if u.backup == "" {
			continue
		}
		if dirfd, _, err := openParent(x.root, u.path); err == nil {
			unix.Unlinkat(dirfd, u.backup, 0)
			unix.Close(dirfd)
		}
	}
	x.undo = nil
}

type dirTime struct {
	path  string
	mtime time.Time
}

// entryName validates a tar entry name and returns it cleaned and relative to the destination ("" for the
// destination itself).
func entryName(name string) (string, error) {
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return "", errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("invalid tar entry name %q", name))
	}
	if strings.HasPrefix(name, "/") {
		return "", errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("tar entry %q has an absolute name", name))
	}
	c := path.Clean(name)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("tar entry %q leaves the destination directory", name))
	}
	if c == "." {
		return "", nil
	}
	return c, nil
}

// throughLink reports an error if a proper prefix of rel is a symlink created by this archive.
func (x *extractor) throughLink(orig, rel string) error {
	for i := 0; i < len(rel); i++ {
		if rel[i] == '/' && x.links[rel[:i]] {
			return errdefs.New(errdefs.ErrInvalid,
				fmt.Sprintf("tar entry %q goes through symlink %q from the same archive", orig, rel[:i]))
		}
	}
	return nil
}

func (x *extractor) entry(h *tar.Header, r io.Reader) error {
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
	default:
		return nil // fifos, devices, global headers, ...: skipped
	}
	rel, err := entryName(h.Name)
	if err != nil {
		return wrap("extract", x.dest, err)
	}
	for k := range h.PAXRecords {
		// Sparse entries are refused: a few bytes of archive would expand to any number of zeros on disk.
		if strings.HasPrefix(k, "GNU.sparse.") {
			return wrap("extract", x.dest, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("tar entry %q is sparse: not supported", h.Name)))
		}
	}
	if err := x.throughLink(h.Name, rel); err != nil {
		return wrap("extract", x.dest, err)
	}
	full := path.Join(x.dest, rel)
	if err := refuseProtected("extract", full); err != nil {
		return err
	}
	if rel == "" {
		if h.Typeflag == tar.TypeDir {
			return nil // the destination itself
		}
		return wrap("extract", full, userErr(errdefs.ErrInvalid, "tar entry names the destination directory", h.Name))
	}
	dirfd, err := x.f.mkdirAllNoting(x.root, path.Dir(full), x.noteCreated)
	if err != nil {
		return wrap("extract", full, err)
	}
	defer unix.Close(dirfd)
	name := path.Base(full)
	mode := uint32(h.Mode) & 07777
	if h.Typeflag != tar.TypeDir {
		if err := x.preserve(dirfd, name, full); err != nil {
			return wrap("extract", full, err)
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		err = x.dir(dirfd, name, full, mode)
		if err == nil {
			delete(x.links, rel)
			x.dirs = append(x.dirs, dirTime{full, h.ModTime})
		}
	case tar.TypeReg:
		mt := h.ModTime
		_, err = x.f.writeAt(dirfd, name, r, mode, &mt)
		if err == nil {
			delete(x.links, rel)
			x.files++
		}
	case tar.TypeSymlink:
		err = x.symlink(dirfd, name, h.Linkname, h.ModTime)
		if err == nil {
			x.links[rel] = true
		}
	case tar.TypeLink:
		var isLink bool
		isLink, err = x.hardlink(dirfd, name, h)
		if err == nil {
			// A hard link to a symlink is a symlink too: later entries must not go through it either.
			if isLink {
				x.links[rel] = true
			} else {
				delete(x.links, rel)
			}
		}
	}
	if err != nil {
		return wrap("extract", full, err)
	}
	return nil
}

func (x *extractor) dir(dirfd int, name, full string, mode uint32) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		// A non-directory in the way goes, kept as a backup until the extraction commits.
		if err := x.preserve(dirfd, name, full); err != nil {
			return err
		}
		if err := unix.Unlinkat(dirfd, name, 0); err != nil && err != unix.ENOENT {
			return err
		}
	}
	fd, created, err := x.f.mkdirIn(dirfd, name, mode)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if created {
		x.noteCreated(full)
	} else if err := unix.Fstat(fd, &st); err == nil {
		x.undo = append(x.undo, undoStep{path: full, chmod: true, mode: st.Mode & 07777})
	}
	return unix.Fchmod(fd, mode)
}

// replace renames tmp over name in dirfd, removing tmp if that fails.
func replace(dirfd int, tmp, name string) error {
	if err := unix.Renameat(dirfd, tmp, dirfd, name); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		if err == unix.EISDIR || err == unix.ENOTEMPTY || err == unix.EEXIST {
			return errdefs.New(errdefs.ErrConflict, "a directory is in the way of tar entry "+name)
		}
		return err
	}
	return nil
}

func (x *extractor) symlink(dirfd int, name, target string, mt time.Time) error {
	if target == "" || strings.IndexByte(target, 0) >= 0 {
		return errdefs.New(errdefs.ErrInvalid, "invalid symlink target")
	}
	var tmp string
	var err error
	for i := 0; i < 16; i++ {
		tmp = tmpName()
		if err = unix.Symlinkat(target, dirfd, tmp); err != unix.EEXIST {
			break
		}
	}
	if err != nil {
		return err
	}
	if err := unix.Fchownat(dirfd, tmp, x.f.uid, x.f.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return err
	}
	ts := unix.NsecToTimespec(mt.UnixNano())
	if err := unix.UtimesNanoAt(dirfd, tmp, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return err
	}
	return replace(dirfd, tmp, name)
}

// hardlink creates name in dirfd as a hard link to the entry's target and reports whether that is a symlink.
func (x *extractor) hardlink(dirfd int, name string, h *tar.Header) (bool, error) {
	trel, err := entryName(h.Linkname)
	if err != nil || trel == "" {
		return false, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("hard link target %q is outside the destination directory", h.Linkname))
	}
	if err := x.throughLink(h.Linkname, trel); err != nil {
		return false, err
	}
	tfd, tname, err := openParent(x.root, path.Join(x.dest, trel))
	if err != nil {
		return false, fmt.Errorf("hard link target %s: %w", h.Linkname, err)
	}
	defer unix.Close(tfd)
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tname, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false, fmt.Errorf("hard link target %s: %w", h.Linkname, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return false, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("hard link target %q is a directory", h.Linkname))
	}
	var tmp string
	for i := 0; i < 16; i++ {
		tmp = tmpName()
		// flags 0: a symlink target is linked itself, never followed.
		if err = unix.Linkat(tfd, tname, dirfd, tmp, 0); err != unix.EEXIST {
			break
		}
	}
	if err != nil {
		return false, fmt.Errorf("hard link to %s: %w", h.Linkname, err)
	}
	if err := replace(dirfd, tmp, name); err != nil {
		return false, err
	}
	// When name already was this inode (a link to itself, or a repeat of an earlier link entry), rename(2) does
	// nothing and leaves tmp: remove it (after a real rename there is nothing left to remove).
	if err := unix.Unlinkat(dirfd, tmp, 0); err != nil && err != unix.ENOENT {
		return false, fmt.Errorf("hard link to %s: %w", h.Linkname, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFREG {
		x.files++
	}
	return st.Mode&unix.S_IFMT == unix.S_IFLNK, nil
}

// finishDirs sets the modification times of the extracted directories, deepest first (creating their
// entries changed them).
func (x *extractor) finishDirs() error {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		fd, err := resolve(x.root, d.path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
		if err != nil {
			continue // removed or replaced by a later entry or by the sandbox
		}
		tv := unix.NsecToTimeval(d.mtime.UnixNano())
		err = unix.Futimes(fd, []unix.Timeval{tv, tv})
		unix.Close(fd)
		if err != nil {
			return wrap("extract", d.path, err)
		}
	}
	return nil
}
