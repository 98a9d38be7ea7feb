package files

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// OpenRead opens the regular file at p for reading. Symlinks are followed inside the root. A directory is
// errdefs.ErrInvalid "is a directory", a fifo, socket or device errdefs.ErrInvalid "not a regular file" (it is
// never opened for I/O), a missing path errdefs.ErrNotFound. The caller closes the file.
func (f *FS) OpenRead(p string) (*os.File, Entry, error) {
	p, err := CleanPath(p)
	if err != nil {
		return nil, Entry{}, err
	}
	if err := refusePseudoRead("read", p); err != nil {
		return nil, Entry{}, err
	}
	root, err := f.acquire()
	if err != nil {
		return nil, Entry{}, err
	}
	defer f.release()
	for attempt := 0; ; attempt++ {
		pfd, err := resolve(root, p, unix.O_PATH)
		if err != nil {
			return nil, Entry{}, wrap("read", p, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(pfd, &st); err != nil {
			unix.Close(pfd)
			return nil, Entry{}, wrap("read", p, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
		case unix.S_IFDIR:
			unix.Close(pfd)
			return nil, Entry{}, wrap("read", p, userErr(errdefs.ErrInvalid, "is a directory", p))
		default:
			unix.Close(pfd)
			return nil, Entry{}, wrap("read", p, userErr(errdefs.ErrInvalid, "not a regular file", p))
		}
		fd, err := reopenRegular(pfd, &st, func() (int, error) {
			return openat2(root, rel(p), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0, inRoot)
		})
		unix.Close(pfd)
		if err == unix.EAGAIN && attempt < 8 {
			continue // swapped while we looked
		}
		if err != nil {
			return nil, Entry{}, wrap("read", p, err)
		}
		return os.NewFile(uintptr(fd), p), makeEntry(p, &st, ""), nil
	}
}

// Write replaces the file at p with the contents of r, streamed. Missing parent directories are created (mode
// 0755, owned by the FS's uid/gid). The data goes to a temporary file in the target's directory that is renamed
// over p at the end, so a failed or aborted write leaves the old content. The new file is owned by uid/gid and
// gets mode (0644 if mode is 0; Go's setuid/setgid/sticky flags and raw unix bits are both understood). If p is
// a symlink, the link itself is replaced; its target is never written. Returns the number of bytes written.
func (f *FS) Write(p string, r io.Reader, mode os.FileMode) (int64, error) {
	p, err := CleanPath(p)
	if err != nil {
		return 0, err
	}
	if p == "/" {
		return 0, wrap("write", p, userErr(errdefs.ErrInvalid, "is a directory", p))
	}
	if err := refuseProtected("write", p); err != nil {
		return 0, err
	}
	root, err := f.acquire()
	if err != nil {
		return 0, err
	}
	defer f.release()
	m := unixMode(mode)
	if m == 0 {
		m = 0o644
	}
	dirfd, err := f.mkdirAll(root, path.Dir(p))
	if err != nil {
		return 0, wrap("write", p, err)
	}
	defer unix.Close(dirfd)
	n, err := f.writeAt(dirfd, path.Base(p), r, m, nil)
	if err != nil {
		return n, wrap("write", p, err)
	}
	return n, nil
}

// tmpName returns a name for a temporary file next to name.
func tmpName() string { return fmt.Sprintf(".ramify-%016x.tmp", rand.Uint64()) }

// writeAt atomically replaces name in dirfd with a regular file holding r's contents, owned by the FS's
// uid/gid, with mode bits m and, if mt is not nil, modification time *mt.
func (f *FS) writeAt(dirfd int, name string, r io.Reader, m uint32, mt *time.Time) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return 0, unix.EISDIR
	}
	var (
		fd  int
		tmp string
		err error
	)
	for i := 0; i < 16; i++ {
		tmp = tmpName()
		fd, err = openat2(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o600, beneath)
		if err != unix.EEXIST {
			break
		}
	}
	if err != nil {
		return 0, err
	}
	file := os.NewFile(uintptr(fd), name)
	fail := func(err error) (int64, error) {
		file.Close()
		unix.Unlinkat(dirfd, tmp, 0)
		return 0, err
	}
	// chown before chmod: chown clears setuid/setgid.
	if err := unix.Fchown(fd, f.uid, f.gid); err != nil {
		return fail(err)
	}
	if err := unix.Fchmod(fd, m); err != nil {
		return fail(err)
	}
	n, err := io.Copy(file, r)
	if err != nil {
		_, e := fail(err)
		return n, e
	}
	if mt != nil {
		tv := unix.NsecToTimeval(mt.UnixNano())
		if err := unix.Futimes(fd, []unix.Timeval{tv, tv}); err != nil {
			return fail(err)
		}
	}
	if err := file.Close(); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return 0, err
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, name); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return 0, err
	}
	return n, nil
}

// mkdirAll makes sure the directory p exists inside the root, creating missing components (owned by uid/gid,
// mode 0755) below the deepest existing one, and returns an fd for it. Every prefix is resolved inside the
// root; new directories are created with mkdirat in the parent's fd and opened without following symlinks.
func (f *FS) mkdirAll(root int, p string) (int, error) { return f.mkdirAllNoting(root, p, nil) }

// mkdirAllNoting is mkdirAll that calls created with the path of each directory it creates, in order.
func (f *FS) mkdirAllNoting(root int, p string, created func(p string)) (int, error) {
	fd, err := resolve(root, p, unix.O_PATH|unix.O_DIRECTORY)
	if err == nil || err != unix.ENOENT {
		if err == unix.ENOTDIR {
			return -1, userErr(errdefs.ErrConflict, "not a directory", p)
		}
		return fd, err
	}
	cur, err := resolve(root, "/", unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, err
	}
	comps := strings.Split(rel(p), "/")
	for i, c := range comps {
		prefix := "/" + strings.Join(comps[:i+1], "/")
		next, err := resolve(root, prefix, unix.O_PATH|unix.O_DIRECTORY)
		if err == unix.ENOENT {
			var made bool
			next, made, err = f.mkdirIn(cur, c, 0o755)
			if err == unix.ELOOP {
				err = unix.ENOTDIR // a dangling symlink
			}
			if made && created != nil {
				created(prefix)
			}
		}
		unix.Close(cur)
		if err == unix.ENOTDIR {
			return -1, userErr(errdefs.ErrConflict, "not a directory", prefix)
		}
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// mkdirIn creates the directory name in dirfd if it does not exist (an existing directory is fine) and returns
// an fd for it. A directory it creates gets the FS's uid/gid and mode perm.
func (f *FS) mkdirIn(dirfd int, name string, perm uint32) (int, bool, error) {
	err := unix.Mkdirat(dirfd, name, 0o700)
	created := err == nil
	if err != nil && err != unix.EEXIST {
		return -1, false, err
	}
	fd, err := openat2(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, beneath)
	if err != nil {
		return -1, false, err
	}
	if created {
		if err := unix.Fchown(fd, f.uid, f.gid); err != nil {
			unix.Close(fd)
			return -1, false, err
		}
		if err := unix.Fchmod(fd, perm); err != nil {
			unix.Close(fd)
			return -1, false, err
		}
	}
	return fd, created, nil
}

// Stat describes the file at p. The final component is not followed: a symlink is reported as a symlink.
func (f *FS) Stat(p string) (Entry, error) {
	p, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	root, err := f.acquire()
	if err != nil {
		return Entry{}, err
	}
	defer f.release()
	e, err := stat(root, p)
	if err != nil {
		return Entry{}, wrap("stat", p, err)
	}
	return e, nil
}

func stat(root int, p string) (Entry, error) {
	var st unix.Stat_t
	if p == "/" {
		if err := unix.Fstat(root, &st); err != nil {
			return Entry{}, err
		}
		e := makeEntry(p, &st, "")
		e.Name = "/"
		return e, nil
	}
	dirfd, name, err := openParent(root, p)
	if err != nil {
		return Entry{}, err
	}
	defer unix.Close(dirfd)
	return statAt(dirfd, name, p)
}

func statAt(dirfd int, name, p string) (Entry, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return Entry{}, err
	}
	target := ""
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		t, err := readlinkAt(dirfd, name)
		if err != nil {
			return Entry{}, err
		}
		target = t
	}
	return makeEntry(p, &st, target), nil
}

func readlinkAt(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// List returns the entries of the directory at p, sorted by name. A symlink at p is followed inside the root;
// symlinks in the directory are reported as symlinks. A path that is not a directory is errdefs.ErrInvalid.
func (f *FS) List(p string) ([]Entry, error) {
	p, err := CleanPath(p)
	if err != nil {
		return nil, err
	}
	if err := refusePseudoRead("list", p); err != nil {
		return nil, err
	}
	root, err := f.acquire()
	if err != nil {
		return nil, err
	}
	defer f.release()
	fd, err := openDir(root, p)
	if err != nil {
		return nil, wrap("list", p, err)
	}
	defer unix.Close(fd)
	names, err := ReadNames(fd)
	if err != nil {
		return nil, wrap("list", p, err)
	}
	sort.Strings(names)
	entries := make([]Entry, 0, len(names))
	for _, n := range names {
		e, err := statAt(fd, n, path.Join(p, n))
		if err == unix.ENOENT {
			continue // removed while we listed
		}
		if err != nil {
			return nil, wrap("list", path.Join(p, n), err)
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// CheckDir returns nil if p resolves (symlinks followed inside the root) to a directory, errdefs.ErrNotFound if
// it does not exist, errdefs.ErrInvalid if it is not a directory.
func (f *FS) CheckDir(p string) error {
	p, err := CleanPath(p)
	if err != nil {
		return err
	}
	root, err := f.acquire()
	if err != nil {
		return err
	}
	defer f.release()
	fd, err := resolve(root, p, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return wrap("stat", p, err)
	}
	unix.Close(fd)
	return nil
}

// openDir opens the directory p (following symlinks inside the root) for reading its entries.
func openDir(root int, p string) (int, error) {
	pfd, err := resolve(root, p, unix.O_PATH)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return -1, userErr(errdefs.ErrInvalid, "not a directory", p)
	}
	if pseudoFS(pfd) {
		return -1, userErr(errdefs.ErrInvalid, "refusing to read a kernel pseudo file system", p)
	}
	return openat2(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0, beneath)
}

// Mkdir creates the directory p (mode 0755, owned by uid/gid). With parents, missing parents are created too
// and an existing directory is not an error; without, a missing parent is errdefs.ErrNotFound and an existing
// p is errdefs.ErrConflict. A non-directory in the way is errdefs.ErrConflict.
func (f *FS) Mkdir(p string, parents bool) (Entry, error) {
	p, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	if err := refuseProtected("mkdir", p); err != nil {
		return Entry{}, err
	}
	root, err := f.acquire()
	if err != nil {
		return Entry{}, err
	}
	defer f.release()
	if parents {
		fd, err := f.mkdirAll(root, p)
		if err != nil {
			return Entry{}, wrap("mkdir", p, err)
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return Entry{}, wrap("mkdir", p, err)
		}
		e := makeEntry(p, &st, "")
		if p == "/" {
			e.Name = "/"
		}
		return e, nil
	}
	if p == "/" {
		return Entry{}, wrap("mkdir", p, userErr(errdefs.ErrConflict, "already exists", p))
	}
	dirfd, name, err := openParent(root, p)
	if err != nil {
		return Entry{}, wrap("mkdir", p, err)
	}
	defer unix.Close(dirfd)
	if err := unix.Mkdirat(dirfd, name, 0o700); err != nil {
		return Entry{}, wrap("mkdir", p, err)
	}
	fd, err := openat2(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, beneath)
	if err != nil {
		return Entry{}, wrap("mkdir", p, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, f.uid, f.gid); err != nil {
		return Entry{}, wrap("mkdir", p, err)
	}
	if err := unix.Fchmod(fd, 0o755); err != nil {
		return Entry{}, wrap("mkdir", p, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Entry{}, wrap("mkdir", p, err)
	}
	return makeEntry(p, &st, ""), nil
}

// Remove deletes p. A symlink is removed itself, never its target. A non-empty directory needs recursive
// (else errdefs.ErrConflict "directory not empty"); recursive removal never follows symlinks and does not
// descend into kernel pseudo file systems. Removing "/" is errdefs.ErrInvalid.
func (f *FS) Remove(p string, recursive bool) error {
	p, err := CleanPath(p)
	if err != nil {
		return err
	}
	if p == "/" {
		return wrap("remove", p, errdefs.New(errdefs.ErrInvalid, "refusing to remove /"))
	}
	if err := refuseProtected("remove", p); err != nil {
		return err
	}
	root, err := f.acquire()
	if err != nil {
		return err
	}
	defer f.release()
	dirfd, name, err := openParent(root, p)
	if err != nil {
		return wrap("remove", p, err)
	}
	defer unix.Close(dirfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return wrap("remove", p, err)
	}
	if mountRoot(dirfd, name) {
		return wrap("remove", p, userErr(errdefs.ErrInvalid, "refusing to remove a mount point", p))
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		err := unix.Unlinkat(dirfd, name, 0)
		if err == unix.EISDIR { // swapped for a directory meanwhile
			err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		}
		return wrap("remove", p, err)
	}
	err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
	if err == unix.ENOTEMPTY || err == unix.EEXIST {
		if !recursive {
			return wrap("remove", p, userErr(errdefs.ErrConflict, "directory not empty", p))
		}
		err = removeAll(dirfd, name, p)
	}
	return wrap("remove", p, err)
}

// removeAll removes name in dirfd and everything below it without following symlinks: each directory is
// opened with O_NOFOLLOW below its parent's fd and its entries are removed relative to that fd.
func removeAll(dirfd int, name, p string) error {
	var err error
	for attempt := 0; attempt < 8; attempt++ {
		fd, oerr := openat2(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, beneath)
		switch oerr {
		case nil:
		case unix.ENOENT:
			return nil
		case unix.ENOTDIR, unix.ELOOP: // not (or no longer) a directory
			err = unix.Unlinkat(dirfd, name, 0)
			if err == unix.ENOENT {
				return nil
			}
			return err
		default:
			return oerr
		}
		if pseudoFS(fd) || mountRoot(dirfd, name) {
			unix.Close(fd)
			return userErr(errdefs.ErrInvalid, "refusing to remove files on a kernel pseudo file system or a mount point", p)
		}
		err = removeContents(fd, p)
		unix.Close(fd)
		if err != nil {
			return err
		}
		err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if err == nil || err == unix.ENOENT {
			return nil
		}
		if err != unix.ENOTEMPTY && err != unix.EEXIST {
			return err
		}
		// Something was created meanwhile: go again.
	}
	return err
}

func removeContents(fd int, p string) error {
	names, err := ReadNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if err == unix.ENOENT {
				continue
			}
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = removeAll(fd, n, path.Join(p, n))
		} else {
			err = unix.Unlinkat(fd, n, 0)
			if err == unix.EISDIR {
				err = removeAll(fd, n, path.Join(p, n))
			}
		}
		if err != nil && err != unix.ENOENT {
			return err
		}
	}
	return nil
}
