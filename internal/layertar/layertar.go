// Package layertar owns the serialisation of a sandbox's writable layer (an overlayfs upper directory) to and
// from a tar stream, for pausing a sandbox into a snapshot store and resuming it later, possibly on another
// machine. The format is PAX tar, and it records everything an upper directory can hold so that a round trip
// loses nothing: regular files (streamed; a sparse file as its data segments only, see typeSparse), directories, symlinks (targets as-is), hard links, character and
// block devices (including overlay whiteouts, which are character devices 0/0), fifos, numeric ownership, full
// modes (setuid, setgid, sticky), nanosecond mtimes and every extended attribute (trusted.overlay.opaque,
// trusted.overlay.redirect, user.overlay.*, security.capability, ...) as "SCHILY.xattr.<name>" PAX records.
//
// Write walks the tree through directory file descriptors (openat with O_NOFOLLOW), so a symlink swapped in
// for a directory is never followed. Extract resolves every parent under the destination with openat2
// (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), refuses names that are absolute or contain "..", and so never writes
// outside the destination or through a symlink, whatever the tar holds.
package layertar

import (
	"archive/tar"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Stats counts what Write wrote or Extract created.
type Stats struct {
	// Entries is the number of tar entries (including the "." entry for the root directory).
	Entries int64
	// Files is the number of regular files with content (hard links to an earlier file are not counted).
	Files int64
	// Bytes is the total size of regular file contents stored: a sparse file counts its data, not its holes.
	Bytes int64
	// Skipped is the number of entries left out because tar cannot hold them (sockets). Paths excluded by
	// Write's skip function are not counted.
	Skipped int64
}

// typeSparse is the type flag of a regular file with holes (a vendor type: POSIX leaves 'A'-'Z' to
// implementations). Go's archive/tar no longer writes the GNU sparse formats and, reading them, hides the map
// behind a reader that returns the holes as zeros (a 1 PiB hole would be 1 PiB of reads), so the layer format
// has its own: the entry's content is, per data segment in increasing offset order, a segmentRecordSize record
// (offset and length, big-endian uint64s) and then the segment's bytes; the holes between segments are not
// stored, and the file's apparent size is the sparseSizeRecord PAX record. Other tar readers see a regular file
// of those records (GNU tar extracts unknown types as regular files); ramify versions before sparse entries
// refuse the type rather than restore a wrong file.
const typeSparse byte = 'R'

const (
	segmentRecordSize = 16
	sparseSizeRecord  = "RAMIFY.sparse.size"
)

// xattrPrefix is the PAX record prefix for extended attributes, as used by GNU tar, bsdtar and archive/tar.
const xattrPrefix = "SCHILY.xattr."

// procFD is the /proc path of an open file descriptor; with a name appended it reaches an entry of that
// directory without resolving any path from the root (used for the l*xattr calls, which have no *at form).
func procFD(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// listXattrs returns the names and values of the extended attributes of path (not following a final
// symlink), or of fd when path is empty.
func listXattrs(fd int, path string) (map[string]string, error) {
	list := func(buf []byte) (int, error) {
		if path == "" {
			return unix.Flistxattr(fd, buf)
		}
		return unix.Llistxattr(path, buf)
	}
	get := func(name string, buf []byte) (int, error) {
		if path == "" {
			return unix.Fgetxattr(fd, name, buf)
		}
		return unix.Lgetxattr(path, name, buf)
	}
	var names []byte
	for {
		n, err := list(nil)
		if err != nil {
			if err == unix.ENOTSUP {
				return nil, nil
			}
			return nil, fmt.Errorf("listxattr: %w", err)
		}
		if n == 0 {
			return nil, nil
		}
		names = make([]byte, n)
		n, err = list(names)
		if err == unix.ERANGE {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listxattr: %w", err)
		}
		names = names[:n]
		break
	}
	out := map[string]string{}
	for _, name := range strings.Split(string(names), "\x00") {
		if name == "" {
			continue
		}
		for {
			n, err := get(name, nil)
			if err == unix.ENODATA {
				break // removed meanwhile
			}
			if err != nil {
				return nil, fmt.Errorf("getxattr %s: %w", name, err)
			}
			val := make([]byte, n)
			n, err = get(name, val)
			if err == unix.ERANGE {
				continue
			}
			if err == unix.ENODATA {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("getxattr %s: %w", name, err)
			}
			out[name] = string(val[:n])
			break
		}
	}
	return out, nil
}

// xattrRecords returns the xattrs recorded in hdr.
func xattrRecords(hdr *tar.Header) map[string]string {
	var out map[string]string
	for k, v := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, xattrPrefix); ok && name != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[name] = v
		}
	}
	return out
}
