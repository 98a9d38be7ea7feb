package image

import (
	"encoding/binary"
	"fmt"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// IDRange is the number of uids and gids the sandboxes' user namespace maps (container 0..65535).
const IDRange = 65536

const capXattr = "security.capability"

// ShiftOwnership adds uidOff to the uid and gidOff to the gid of every entry under root, root included, so
// that a tree built by the host's root becomes owned by root of a user namespace that maps container uid 0 to
// host uid uidOff. It uses lchown and never follows symbolic links; hard-linked files are shifted once.
// chown clears the setuid and setgid bits, so they are put back afterwards, and file capabilities
// (security.capability), which chown also drops, are written back as version 3 capabilities whose root id is
// uidOff, so that they take effect inside the user namespace.
//
// It must run exactly once, on a freshly built tree: it is not idempotent. As a guard against a second run it
// refuses trees with ids at or above IDRange, which the user namespace could not map anyway.
func ShiftOwnership(root string, uidOff, gidOff int) error {
	if uidOff < 0 || gidOff < 0 || uidOff > 1<<31 || gidOff > 1<<31 {
		return fmt.Errorf("shift ownership: bad offsets %d:%d", uidOff, gidOff)
	}
	type devIno struct{ dev, ino uint64 }
	seen := map[devIno]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		typ := st.Mode & unix.S_IFMT
		if st.Nlink > 1 && typ != unix.S_IFDIR {
			k := devIno{st.Dev, st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		if st.Uid >= IDRange || st.Gid >= IDRange {
			return fmt.Errorf("%s is owned by %d:%d, outside the 0..%d range a sandbox maps (already shifted?)",
				p, st.Uid, st.Gid, IDRange-1)
		}
		var caps []byte
		if typ == unix.S_IFREG {
			caps = getCaps(p)
		}
		if err := unix.Lchown(p, int(st.Uid)+uidOff, int(st.Gid)+gidOff); err != nil {
			return &fs.PathError{Op: "lchown", Path: p, Err: err}
		}
		if typ != unix.S_IFLNK && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			if err := unix.Chmod(p, st.Mode&0o7777); err != nil {
				return &fs.PathError{Op: "chmod", Path: p, Err: err}
			}
		}
		if caps != nil {
			if err := unix.Lsetxattr(p, capXattr, shiftCaps(caps, uidOff), 0); err != nil {
				return &fs.PathError{Op: "setxattr " + capXattr, Path: p, Err: err}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("shift ownership: %w", err)
	}
	return nil
}

// getCaps returns p's security.capability attribute, or nil.
func getCaps(p string) []byte {
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(p, capXattr, buf)
	if err != nil || n <= 0 { // ENODATA (none) or ENOTSUP (no xattrs on this file system)
		return nil
	}
	return buf[:n]
}

// vfs_cap_data layout (linux/capability.h).
const (
	vfsCapRevisionMask = 0xFF000000
	vfsCapRevision2    = 0x02000000
	vfsCapRevision3    = 0x03000000
	vfsCapFlagsMask    = 0x00FFFFFF
	xattrCapsSz2       = 20
	xattrCapsSz3       = 24
)

// shiftCaps turns a version 2 capability attribute into version 3 with root id uidOff (and moves a version 3
// root id by uidOff); other versions are returned unchanged.
func shiftCaps(c []byte, uidOff int) []byte {
	if len(c) < 4 {
		return c
	}
	magic := binary.LittleEndian.Uint32(c)
	switch {
	case magic&vfsCapRevisionMask == vfsCapRevision2 && len(c) == xattrCapsSz2:
		out := make([]byte, xattrCapsSz3)
		copy(out, c)
		binary.LittleEndian.PutUint32(out, vfsCapRevision3|magic&vfsCapFlagsMask)
		binary.LittleEndian.PutUint32(out[xattrCapsSz2:], uint32(uidOff))
		return out
	case magic&vfsCapRevisionMask == vfsCapRevision3 && len(c) == xattrCapsSz3:
		out := append([]byte(nil), c...)
		binary.LittleEndian.PutUint32(out[xattrCapsSz2:], binary.LittleEndian.Uint32(c[xattrCapsSz2:])+uint32(uidOff))
		return out
	}
	return c
}
