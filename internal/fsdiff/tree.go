package fsdiff

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/files"
)

// noFollow resolves a path below a layer's directory fd without following a symlink in any component (one that
// sandbox code planted in its upper layer would otherwise lead the server, as root, into the host's files), never
// leaving that directory (no `..` above it) nor its mount.
const noFollow = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// maxRetries bounds the retries of openat2 on EAGAIN (a rename elsewhere on the file system during the lookup).
const maxRetries = 256

// tree is one layer's directory (an upper layer or an image layer), open: every path in it is resolved from
// this fd with noFollow. A path through a symlink or a non-directory is no entry of the layer: overlayfs does
// not look below a non-directory either, and a symlink there is an entry compared by its target, never a
// directory to descend into.
type tree struct {
	name string // what the layer is to the caller ("a's writable layer"), for messages
	fd   int    // O_PATH
}

// openTree opens the layer at dir; name says what it is in messages, which name no host path: they reach API
// clients, to whom the server's data directory is none of their business.
func openTree(dir, name string) (*tree, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	return &tree{name: name, fd: fd}, nil
}

func (t *tree) close() { unix.Close(t.fd) }

// at names rel of t in messages.
func (t *tree) at(rel string) string { return rel + " (" + t.name + ")" }

// open opens rel (a clean absolute path inside the sandbox) below t with noFollow.
func (t *tree) open(rel string, flags uint64) (int, error) {
	name := strings.TrimLeft(rel, "/")
	if name == "" {
		name = "."
	}
	how := unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: noFollow}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(t.fd, name, &how)
		if (err == unix.EAGAIN || err == unix.EINTR) && i < maxRetries {
			continue
		}
		return fd, err
	}
}

// absent reports whether err of a lookup in a layer means that the layer holds nothing at the path: it is
// missing, or a component on the way is not a directory or is a symlink (ELOOP under RESOLVE_NO_SYMLINKS).
func absent(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)
}

// lstat is what t holds at rel, not followed; nil when absent.
func (t *tree) lstat(rel string) (*unix.Stat_t, error) {
	fd, err := t.open(rel, unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		if absent(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("lstat %s: %w", t.at(rel), err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, "", &st, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, fmt.Errorf("lstat %s: %w", t.at(rel), err)
	}
	return &st, nil
}

// openDir opens the directory at rel for reading; absent (see absent) when there is none.
func (t *tree) openDir(rel string) (int, error) {
	return t.open(rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
}

// opaque reports whether rel is an opaque directory of t (it hides the layers below it).
func (t *tree) opaque(rel string) bool {
	fd, err := t.openDir(rel)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return fopaque(fd)
}

// hides reports whether the entry st at rel of t hides what the layers below hold at and under rel: it is not a
// directory (a file, a symlink, a whiteout), or it is an opaque directory.
func (t *tree) hides(rel string, st *unix.Stat_t) bool {
	return st != nil && (!isDir(st) || t.opaque(rel))
}

// names are the names in the directory at rel of t (none when there is none).
func (t *tree) names(rel string) ([]string, error) {
	fd, err := t.openDir(rel)
	if err != nil {
		if absent(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("open %s: %w", t.at(rel), err)
	}
	defer unix.Close(fd)
	names, err := files.ReadNames(fd)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", t.at(rel), err)
	}
	return names, nil
}

// readlink is the target of the symlink at rel of t.
func (t *tree) readlink(rel string) (string, error) {
	fd, err := t.open(rel, unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return "", fmt.Errorf("readlink %s: %w", t.at(rel), err)
	}
	defer unix.Close(fd)
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, "", buf)
	if err != nil {
		return "", fmt.Errorf("readlink %s: %w", t.at(rel), err)
	}
	return string(buf[:n]), nil
}

// openRegular opens the regular file at rel of t for reading. The type is checked on an O_PATH fd before the file
// is opened for I/O through /proc/self/fd (that very inode: no second lookup), so a file the sandbox swapped for
// a fifo or a device node meanwhile is never opened.
func (t *tree) openRegular(rel string) (int, error) {
	pfd, err := t.open(rel, unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", t.at(rel), err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return -1, fmt.Errorf("stat %s: %w", t.at(rel), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return -1, fmt.Errorf("open %s: no longer a regular file (changed during the diff)", t.at(rel))
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", pfd), unix.O_RDONLY|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", t.at(rel), err)
	}
	return fd, nil
}
