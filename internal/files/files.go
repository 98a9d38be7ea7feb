// Package files owns host-side access to a sandbox's root file system: reading, writing, listing, creating,
// removing and archiving files inside a directory that the sandbox's (hostile) code also controls.
//
// Every lookup goes through openat2(2) relative to one root directory fd with RESOLVE_IN_ROOT and
// RESOLVE_NO_MAGICLINKS, so `..` and absolute symlinks are clamped to the root by the kernel and proc magic links
// are refused. Operations that must not follow the final component (stat, remove, rename over, chown) work on
// the parent directory's fd plus the final name with the *at system calls, and single-name lookups below a
// directory fd use RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS. Files are never opened for I/O before their type has
// been checked through an O_PATH fd, so fifos and device nodes cannot block or trigger side effects, and
// regular files on kernel pseudo file systems (procfs, sysfs, ...) mounted inside the sandbox are refused.
package files

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// MaxPathLen is the longest path CleanPath accepts.
const MaxPathLen = 4096

const (
	// inRoot resolves a path relative to the sandbox root fd, clamping `..` and absolute symlinks to it.
	inRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS
	// beneath resolves a single name below a directory fd without following any symlink.
	beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS
	// maxRetries bounds the retries of openat2 on EAGAIN (concurrent renames during RESOLVE_IN_ROOT lookups).
	maxRetries = 256
)

// FS gives access to the files below one root directory. Its methods are safe for concurrent use. Close may be
// called while other calls are running: the root fd is released when the last of them returns.
type FS struct {
	uid, gid int

	mu     sync.Mutex
	fd     int
	refs   int
	closed bool
}

// Entry describes one file as returned by Stat, List, Mkdir and OpenRead.
type Entry struct {
	// Name is the final path component ("/" for the root).
	Name string `json:"name"`
	// Path is the absolute path inside the sandbox, as the caller named it (symlinks are not resolved).
	Path string `json:"path"`
	// Type is "file", "dir", "symlink" or "other".
	Type string `json:"type"`
	// Size is the size in bytes (for a symlink, the length of its target).
	Size int64 `json:"size"`
	// Mode is the permission bits, including setuid, setgid and sticky, as 4 octal digits ("0644", "4755").
	Mode string `json:"mode"`
	// MTime is the modification time, in UTC.
	MTime time.Time `json:"mtime"`
	// LinkTarget is the target of a symlink as stored, never resolved; empty for other types.
	LinkTarget string `json:"link_target"`
}

// Open opens root (a directory; in production /proc/<pid>/root of the sandbox's agent process) and returns an
// FS rooted there. Files and directories that the FS creates are owned by uid and gid (-1 leaves the owner
// unchanged, that is the server's).
func Open(root string, uid, gid int) (*FS, error) {
	// The root itself may be a /proc/<pid>/root magic link: a plain open is intended here; only lookups inside
	// the root refuse magic links.
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open sandbox root %s: %w", root, err)
	}
	return &FS{uid: uid, gid: gid, fd: fd}, nil
}

// Close releases the root fd (once every running call has returned). Closing twice is not an error.
func (f *FS) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	if f.refs == 0 {
		return f.closeFd()
	}
	return nil
}

func (f *FS) closeFd() error {
	fd := f.fd
	f.fd = -1
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close sandbox root: %w", err)
	}
	return nil
}

// acquire returns the root fd and pins it until release.
func (f *FS) acquire() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return -1, errdefs.New(errdefs.ErrConflict, "sandbox file system is closed")
	}
	f.refs++
	return f.fd, nil
}

func (f *FS) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refs--
	if f.refs == 0 && f.closed {
		_ = f.closeFd()
	}
}

// CleanPath validates a path given by an API user and returns its path.Clean'd form. The path must be
// absolute, at most MaxPathLen bytes and free of NUL bytes; errors match errdefs.ErrInvalid.
func CleanPath(p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.New(errdefs.ErrInvalid, "path is required")
	case len(p) > MaxPathLen:
		return "", errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("path is longer than %d bytes", MaxPathLen))
	case strings.IndexByte(p, 0) >= 0:
		return "", errdefs.New(errdefs.ErrInvalid, "path must not contain NUL bytes")
	case p[0] != '/':
		return "", errdefs.New(errdefs.ErrInvalid, "path must be absolute")
	}
	return path.Clean(p), nil
}

// protectedRoots are the sandbox's kernel and device file systems: the API never creates, replaces or removes
// anything at or below them (the sandbox's own code may, as root in the sandbox). From the host, in another
// mount namespace, removing /proc would not fail with EBUSY as it does inside: it would detach the sandbox's
// proc mount.
var protectedRoots = []string{"/proc", "/sys", "/dev"}

// protected reports whether the clean absolute path p is one of protectedRoots or below one.
func protected(p string) bool {
	for _, r := range protectedRoots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

// refuseProtected is errdefs.ErrInvalid for a change at or below /proc, /sys or /dev.
func refuseProtected(op, p string) error {
	if !protected(p) {
		return nil
	}
	return wrap(op, p, userErr(errdefs.ErrInvalid, "refusing to change /proc, /sys or /dev (kernel and device file systems)", p))
}

// pseudoPath reports whether the clean absolute path p is /proc or /sys or below them: never read or listed,
// whatever the sandbox mounted there (from the host, /proc/self names no process of the sandbox's).
func pseudoPath(p string) bool {
	for _, r := range []string{"/proc", "/sys"} {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

// refusePseudoRead is errdefs.ErrInvalid for reading or listing at or below /proc or /sys.
func refusePseudoRead(op, p string) error {
	if !pseudoPath(p) {
		return nil
	}
	return wrap(op, p, userErr(errdefs.ErrInvalid, "refusing to read a kernel pseudo file system", p))
}

// mountRoot reports whether name in dirfd (not followed) is the root of a mount: a mount point in the sandbox's
// mount namespace, which the API never removes.
func mountRoot(dirfd int, name string) bool {
	var stx unix.Statx_t
	if err := unix.Statx(dirfd, name, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, unix.STATX_TYPE, &stx); err != nil {
		return false
	}
	return stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
}

// rel turns a clean absolute path into the relative form used with the root fd.
func rel(p string) string {
	r := strings.TrimLeft(p, "/")
	if r == "" {
		return "."
	}
	return r
}

// openat2 wraps unix.Openat2, adding O_CLOEXEC and retrying on EAGAIN/EINTR a bounded number of times.
func openat2(dirfd int, name string, flags uint64, mode uint32, resolve uint64) (int, error) {
	how := unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Mode: uint64(mode), Resolve: resolve}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, name, &how)
		if err == nil {
			return fd, nil
		}
		if (err == unix.EAGAIN || err == unix.EINTR) && i < maxRetries {
			continue
		}
		return -1, err
	}
}

// resolve opens the clean absolute path p inside the root (following symlinks, clamped to the root).
func resolve(root int, p string, flags uint64) (int, error) {
	return openat2(root, rel(p), flags, 0, inRoot)
}

// openParent opens the directory containing p (resolved inside the root) and returns it with p's final name.
// p must not be "/".
func openParent(root int, p string) (int, string, error) {
	dir, name := path.Split(p)
	fd, err := resolve(root, path.Clean(dir), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, "", err
	}
	return fd, name, nil
}

// wrap turns a system error into an error carrying one of the errdefs sentinels where one applies, with the
// operation and path as context.
func wrap(op, p string, err error) error {
	if err == nil {
		return nil
	}
	for _, kind := range []error{errdefs.ErrNotFound, errdefs.ErrInvalid, errdefs.ErrConflict,
		errdefs.ErrUnauthorized, errdefs.ErrTooLarge} {
		if errors.Is(err, kind) {
			return fmt.Errorf("%s %s: %w", op, p, err)
		}
	}
	var e error
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		e = errdefs.New(errdefs.ErrNotFound, "no such file or directory: "+p)
	case errors.Is(err, unix.ELOOP):
		e = errdefs.New(errdefs.ErrInvalid, "too many levels of symbolic links: "+p)
	case errors.Is(err, unix.EXDEV):
		e = errdefs.New(errdefs.ErrInvalid, "path escapes the sandbox root: "+p)
	case errors.Is(err, unix.ENAMETOOLONG):
		e = errdefs.New(errdefs.ErrInvalid, "file name too long: "+p)
	case errors.Is(err, unix.EISDIR):
		e = errdefs.New(errdefs.ErrInvalid, "is a directory: "+p)
	case errors.Is(err, unix.EEXIST):
		e = errdefs.New(errdefs.ErrConflict, "already exists: "+p)
	case errors.Is(err, unix.EBUSY):
		e = errdefs.New(errdefs.ErrConflict, "resource busy (a mount point?): "+p)
	case errors.Is(err, unix.ENOTEMPTY):
		e = errdefs.New(errdefs.ErrConflict, "directory not empty: "+p)
	case errors.Is(err, io.ErrUnexpectedEOF):
		e = errdefs.New(errdefs.ErrInvalid, "the input ends early (a truncated archive entry or body): "+p)
	default:
		e = err
	}
	return fmt.Errorf("%s %s: %w", op, p, e)
}

func userErr(kind error, msg, p string) error { return errdefs.New(kind, msg+": "+p) }

// fileType maps a stat mode to Entry.Type.
func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	default:
		return "other"
	}
}

func mtime(st *unix.Stat_t) time.Time { return time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC() }

func makeEntry(p string, st *unix.Stat_t, target string) Entry {
	name := path.Base(p)
	return Entry{
		Name:       name,
		Path:       p,
		Type:       fileType(st.Mode),
		Size:       st.Size,
		Mode:       fmt.Sprintf("%04o", st.Mode&07777),
		MTime:      mtime(st),
		LinkTarget: target,
	}
}

// unixMode converts an os.FileMode to mode bits for chmod. Both Go's flags (fs.ModeSetuid, ...) and raw unix
// bits in the low 12 bits (as from parsing "4755" in octal) are accepted.
func unixMode(m os.FileMode) uint32 {
	u := uint32(m) & 07777
	if m&fs.ModeSetuid != 0 {
		u |= unix.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		u |= unix.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		u |= unix.S_ISVTX
	}
	return u
}

// pseudoFS reports whether fd lives on a kernel pseudo file system whose files must never be read or
// traversed by the server on a sandbox's behalf (reading /proc/kcore as host root, for one).
func pseudoFS(fd int) bool {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return true
	}
	switch uint32(sfs.Type) {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.DEBUGFS_MAGIC, unix.SECURITYFS_MAGIC, unix.TRACEFS_MAGIC,
		unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC, unix.BPF_FS_MAGIC, unix.EFIVARFS_MAGIC,
		unix.PSTOREFS_MAGIC, unix.SELINUX_MAGIC, unix.BINFMTFS_MAGIC, unix.NSFS_MAGIC:
		return true
	}
	return false
}

// reopenRegular opens the regular file that the O_PATH fd pfd refers to for reading. It goes through
// /proc/self/fd so the very inode already checked is opened (no second lookup); if procfs is not available it
// falls back to fallback() and checks that the same inode was opened. The result has O_NONBLOCK cleared.
func reopenRegular(pfd int, st *unix.Stat_t, fallback func() (int, error)) (int, error) {
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", pfd),
		unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		fd, err = fallback()
	}
	if err != nil {
		return -1, err
	}
	var st2 unix.Stat_t
	if err := unix.Fstat(fd, &st2); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if st2.Mode&unix.S_IFMT != unix.S_IFREG || st2.Dev != st.Dev || st2.Ino != st.Ino {
		unix.Close(fd)
		return -1, unix.EAGAIN
	}
	if pseudoFS(fd) {
		unix.Close(fd)
		return -1, errdefs.New(errdefs.ErrInvalid, "refusing to read a kernel pseudo file system")
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return -1, err
	}
	*st = st2
	return fd, nil
}

// ReadNames returns the names in the directory open as fd, without "." and ".." (getdents: no stat of each
// entry, no path resolution). The diff (internal/fsdiff) lists layer directories with it too.
func ReadNames(fd int) ([]string, error) {
	buf := make([]byte, 32*1024)
	var names []string
	for {
		n, err := unix.ReadDirent(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}
