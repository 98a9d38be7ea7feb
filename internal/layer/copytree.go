package layer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// copier copies directory trees with everything an overlayfs upper directory may hold: regular files
// (reflinked where the file system supports it, holes preserved otherwise), directories, symlinks, hard links,
// device nodes (overlay whiteouts are 0/0 character devices), fifos, sockets, ownership, all permission bits,
// extended attributes (trusted.overlay.*, user.overlay.*, security.*, ACLs) and access/modification times.
type copier struct {
	noReflink atomic.Bool // FICLONE is known not to work on this file system
	noCFR     atomic.Bool // copy_file_range is known not to work
}

type inodeKey struct{ dev, ino uint64 }

// copyRun is the state of one copyTree call.
type copyRun struct {
	c     *copier
	ctx   context.Context
	links map[inodeKey]string // first destination path of each multiply linked source inode
	names []byte              // xattr name buffer
	value []byte              // xattr value buffer
	buf   []byte              // read/write fallback buffer
}

// copyTree copies the directory src to dst. If dstExists, dst is an existing empty directory that receives
// src's contents and attributes; otherwise dst is created. On error dst is left for the caller to remove.
func (c *copier) copyTree(ctx context.Context, src, dst string, dstExists bool) error {
	r := &copyRun{c: c, ctx: ctx, links: map[inodeKey]string{}}
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("copy %s: %w", src, unix.ENOTDIR)
	}
	if err := r.copyDir(src, dst, &st, dstExists); err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	return nil
}

func (r *copyRun) copyDir(src, dst string, st *unix.Stat_t, exists bool) error {
	if !exists {
		if err := unix.Mkdir(dst, 0o700); err != nil {
			return &os.PathError{Op: "mkdir", Path: dst, Err: err}
		}
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("read directory %s: %w", src, err)
	}
	for _, name := range names {
		if err := r.ctx.Err(); err != nil {
			return err
		}
		if err := r.copyEntry(filepath.Join(src, name), filepath.Join(dst, name)); err != nil {
			return err
		}
	}
	return r.setAttrs(src, dst, st, -1, -1)
}

func (r *copyRun) copyEntry(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: src, Err: err}
	}
	typ := st.Mode & unix.S_IFMT
	if typ == unix.S_IFDIR {
		return r.copyDir(src, dst, &st, false)
	}
	if st.Nlink > 1 {
		key := inodeKey{uint64(st.Dev), st.Ino}
		if first, ok := r.links[key]; ok {
			if err := unix.Link(first, dst); err != nil {
				return &os.LinkError{Op: "link", Old: first, New: dst, Err: err}
			}
			return nil
		}
		r.links[key] = dst
	}
	switch typ {
	case unix.S_IFREG:
		return r.copyFile(src, dst, &st)
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := unix.Symlink(target, dst); err != nil {
			return &os.PathError{Op: "symlink", Path: dst, Err: err}
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
		if err := unix.Mknod(dst, typ|0o600, int(st.Rdev)); err != nil {
			return &os.PathError{Op: "mknod", Path: dst, Err: err}
		}
	default:
		return fmt.Errorf("%s: unsupported file type %#o", src, typ)
	}
	return r.setAttrs(src, dst, &st, -1, -1)
}

func (r *copyRun) copyFile(src, dst string, st *unix.Stat_t) error {
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOATIME, 0)
	if errors.Is(err, unix.EPERM) { // O_NOATIME needs ownership or CAP_FOWNER
		sfd, err = unix.Open(src, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return &os.PathError{Op: "open", Path: src, Err: err}
	}
	defer unix.Close(sfd)
	dfd, err := unix.Open(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "create", Path: dst, Err: err}
	}
	defer func() {
		if dfd >= 0 {
			unix.Close(dfd)
		}
	}()
	if err := r.copyData(sfd, dfd, st.Size); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := r.setAttrs(src, dst, st, sfd, dfd); err != nil {
		return err
	}
	err = unix.Close(dfd)
	dfd = -1
	if err != nil {
		return &os.PathError{Op: "close", Path: dst, Err: err}
	}
	return nil
}

// copyData copies size bytes from sfd to dfd: a reflink if possible, else copy_file_range (or read/write)
// over the data segments only, so holes stay holes.
func (r *copyRun) copyData(sfd, dfd int, size int64) error {
	if size == 0 {
		return nil
	}
	if !r.c.noReflink.Load() {
		err := unix.IoctlFileClone(dfd, sfd)
		if err == nil {
			return nil
		}
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EXDEV) ||
			errors.Is(err, unix.ENOSYS) {
			r.c.noReflink.Store(true)
		}
		// Other errors (e.g. EINVAL for a nodatacow file on btrfs) are per file: fall through to copying.
	}
	var off int64
	for off < size {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole up to EOF remains
		}
		hole := size
		if err != nil {
			data = off // SEEK_DATA unsupported: treat the rest as data
		} else if h, err := unix.Seek(sfd, data, unix.SEEK_HOLE); err == nil && h < size {
			hole = h
		}
		if data >= size {
			break
		}
		if err := r.copyRange(sfd, dfd, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return unix.Ftruncate(dfd, size)
}

// copyRange copies n bytes at offset off from sfd to the same offset in dfd.
func (r *copyRun) copyRange(sfd, dfd int, off, n int64) error {
	for n > 0 && !r.c.noCFR.Load() {
		soff, doff := off, off
		chunk := n
		if chunk > 1<<30 {
			chunk = 1 << 30
		}
		w, err := unix.CopyFileRange(sfd, &soff, dfd, &doff, int(chunk), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) ||
				errors.Is(err, unix.EINVAL) {
				r.c.noCFR.Store(true)
				break
			}
			return err
		}
		if w == 0 {
			return nil // source shorter than expected
		}
		off += int64(w)
		n -= int64(w)
	}
	if n <= 0 {
		return nil
	}
	if r.buf == nil {
		r.buf = make([]byte, 1<<20)
	}
	for n > 0 {
		b := r.buf
		if int64(len(b)) > n {
			b = b[:n]
		}
		m, err := unix.Pread(sfd, b, off)
		if err != nil {
			return err
		}
		if m == 0 {
			return nil
		}
		if _, err := writeFullAt(dfd, b[:m], off); err != nil {
			return err
		}
		off += int64(m)
		n -= int64(m)
	}
	return nil
}

func writeFullAt(fd int, b []byte, off int64) (int, error) {
	total := 0
	for len(b) > 0 {
		w, err := unix.Pwrite(fd, b, off)
		if err != nil {
			return total, err
		}
		total += w
		b = b[w:]
		off += int64(w)
	}
	return total, nil
}

// setAttrs gives dst src's owner, extended attributes, permission bits and times, in the order that keeps them
// all: chown clears setuid/setgid and file capabilities, so it comes first; times come last because every
// other change would touch them. sfd and dfd are open descriptors of regular files, or -1.
func (r *copyRun) setAttrs(src, dst string, st *unix.Stat_t, sfd, dfd int) error {
	isLink := st.Mode&unix.S_IFMT == unix.S_IFLNK
	var err error
	if dfd >= 0 {
		err = unix.Fchown(dfd, int(st.Uid), int(st.Gid))
	} else {
		err = unix.Lchown(dst, int(st.Uid), int(st.Gid))
	}
	if err != nil {
		return &os.PathError{Op: "chown", Path: dst, Err: err}
	}
	if err := r.copyXattrs(src, dst, sfd, dfd); err != nil {
		return err
	}
	if !isLink {
		if dfd >= 0 {
			err = unix.Fchmod(dfd, st.Mode&0o7777)
		} else {
			err = unix.Chmod(dst, st.Mode&0o7777)
		}
		if err != nil {
			return &os.PathError{Op: "chmod", Path: dst, Err: err}
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimes", Path: dst, Err: err}
	}
	return nil
}

// copyXattrs copies every extended attribute of src to dst (through the descriptors when given).
func (r *copyRun) copyXattrs(src, dst string, sfd, dfd int) error {
	list := func(buf []byte) (int, error) {
		if sfd >= 0 {
			return unix.Flistxattr(sfd, buf)
		}
		return unix.Llistxattr(src, buf)
	}
	if r.names == nil {
		r.names = make([]byte, 4096)
	}
	var n int
	for {
		var err error
		n, err = list(r.names)
		if errors.Is(err, unix.ERANGE) {
			size, err := list(nil)
			if err != nil {
				return &os.PathError{Op: "listxattr", Path: src, Err: err}
			}
			r.names = make([]byte, size+256)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP) {
			return nil
		}
		if err != nil {
			return &os.PathError{Op: "listxattr", Path: src, Err: err}
		}
		break
	}
	names := r.names[:n]
	for len(names) > 0 {
		i := 0
		for i < len(names) && names[i] != 0 {
			i++
		}
		name := string(names[:i])
		if i < len(names) {
			i++
		}
		names = names[i:]
		if name == "" {
			continue
		}
		val, err := r.getXattr(src, name, sfd)
		if errors.Is(err, unix.ENODATA) {
			continue // removed meanwhile
		}
		if err != nil {
			return &os.PathError{Op: "getxattr " + name, Path: src, Err: err}
		}
		if dfd >= 0 {
			err = unix.Fsetxattr(dfd, name, val, 0)
		} else {
			err = unix.Lsetxattr(dst, name, val, 0)
		}
		if err != nil {
			return &os.PathError{Op: "setxattr " + name, Path: dst, Err: err}
		}
	}
	return nil
}

func (r *copyRun) getXattr(src, name string, sfd int) ([]byte, error) {
	get := func(buf []byte) (int, error) {
		if sfd >= 0 {
			return unix.Fgetxattr(sfd, name, buf)
		}
		return unix.Lgetxattr(src, name, buf)
	}
	if r.value == nil {
		r.value = make([]byte, 4096)
	}
	for {
		n, err := get(r.value)
		if errors.Is(err, unix.ERANGE) {
			size, err := get(nil)
			if err != nil {
				return nil, err
			}
			r.value = make([]byte, size+256)
			continue
		}
		if err != nil {
			return nil, err
		}
		return r.value[:n], nil
	}
}
