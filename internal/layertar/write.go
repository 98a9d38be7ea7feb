package layertar

import (
	"archive/tar"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Write streams the tree under dir as a PAX tar to w: regular files (streamed, never whole in memory; a file
// with holes as a typeSparse entry holding only its data segments),
// directories, symlinks (targets as-is, never followed), hard links (TypeLink to the first path written of
// the inode), character and block devices (including overlay whiteouts 0/0) and fifos, with numeric uid/gid,
// full mode including setuid/setgid/sticky, mtime with nanoseconds and every xattr as a
// "SCHILY.xattr.<name>" PAX record. Entry names are relative ("a/b", directories "a/b/"); dir itself is
// recorded as an entry named "." carrying its mode, owner, xattrs and mtime. skip(rel) == true excludes a
// path and, for a directory, its subtree; a nil skip excludes nothing. maxData > 0 bounds the file data
// written (Stats.Bytes): a tree holding more fails with an error wrapping EDQUOT, before the file that would
// pass the bound is written. Sockets are left out and counted in
// Stats.Skipped. The tree should be quiescent while Write runs (a file that shrinks meanwhile is an error).
func Write(w io.Writer, dir string, skip func(rel string) bool, maxData int64) (Stats, error) {
	wr := &writer{tw: tar.NewWriter(w), skip: skip, maxData: maxData, links: map[inode]string{}, buf: make([]byte, 1<<20)}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return wr.stats, fmt.Errorf("open %s: %w", dir, err)
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return wr.stats, fmt.Errorf("stat %s: %w", dir, err)
	}
	xattrs, err := listXattrs(fd, "")
	if err != nil {
		return wr.stats, fmt.Errorf("%s: %w", dir, err)
	}
	if err := wr.header(".", &st, tar.TypeDir, "", xattrs, 0, nil); err != nil {
		return wr.stats, err
	}
	if err := wr.walk(f, fd, ""); err != nil {
		return wr.stats, err
	}
	if err := wr.tw.Close(); err != nil {
		return wr.stats, fmt.Errorf("close tar: %w", err)
	}
	return wr.stats, nil
}

type inode struct{ dev, ino uint64 }

type writer struct {
	tw      *tar.Writer
	skip    func(string) bool
	maxData int64            // bound on Stats.Bytes (0: none)
	links   map[inode]string // first path written of each multiply-linked inode
	stats   Stats
	buf     []byte
}

// walk writes the entries of the directory open as f/fd, whose path relative to the root is rel.
func (wr *writer) walk(f *os.File, fd int, rel string) error {
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("readdir %q: %w", rel, err)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := wr.entry(fd, rel, name); err != nil {
			return err
		}
	}
	return nil
}

// entry writes the entry name of the directory fd (at rel) and, for a directory, its subtree.
func (wr *writer) entry(dirfd int, dirRel, name string) error {
	rel := name
	if dirRel != "" {
		rel = dirRel + "/" + name
	}
	if wr.skip != nil && wr.skip(rel) {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // removed since readdir
		}
		return fmt.Errorf("lstat %q: %w", rel, err)
	}
	// Hard links: every later path of an inode becomes a TypeLink to the first one.
	if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
		key := inode{uint64(st.Dev), st.Ino}
		if first, ok := wr.links[key]; ok {
			hdr := &tar.Header{Typeflag: tar.TypeLink, Name: rel, Linkname: first, Format: tar.FormatPAX,
				Mode: int64(st.Mode & 07777), Uid: int(st.Uid), Gid: int(st.Gid), ModTime: mtime(&st)}
			if err := wr.tw.WriteHeader(hdr); err != nil {
				return fmt.Errorf("write header %q: %w", rel, err)
			}
			wr.stats.Entries++
			return nil
		}
		wr.links[key] = rel
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return wr.file(dirfd, name, rel, &st)
	case unix.S_IFDIR:
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %q: %w", rel, err)
		}
		f := os.NewFile(uintptr(fd), rel)
		defer f.Close()
		if err := sameFile(fd, &st); err != nil {
			return fmt.Errorf("%q: %w", rel, err)
		}
		xattrs, err := listXattrs(fd, "")
		if err != nil {
			return fmt.Errorf("%q: %w", rel, err)
		}
		if err := wr.header(rel+"/", &st, tar.TypeDir, "", xattrs, 0, nil); err != nil {
			return err
		}
		return wr.walk(f, fd, rel)
	case unix.S_IFLNK:
		target, err := readlinkat(dirfd, name)
		if err != nil {
			return fmt.Errorf("readlink %q: %w", rel, err)
		}
		return wr.other(dirfd, name, rel, &st, tar.TypeSymlink, target)
	case unix.S_IFCHR:
		return wr.other(dirfd, name, rel, &st, tar.TypeChar, "")
	case unix.S_IFBLK:
		return wr.other(dirfd, name, rel, &st, tar.TypeBlock, "")
	case unix.S_IFIFO:
		return wr.other(dirfd, name, rel, &st, tar.TypeFifo, "")
	default: // sockets: tar has no type for them, and they are meaningless without their process
		wr.stats.Skipped++
		return nil
	}
}

// other writes a symlink, device or fifo entry.
func (wr *writer) other(dirfd int, name, rel string, st *unix.Stat_t, typ byte, link string) error {
	xattrs, err := listXattrs(-1, procFD(dirfd)+"/"+name)
	if err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	return wr.header(rel, st, typ, link, xattrs, 0, nil)
}

// file writes a regular file entry and its content.
func (wr *writer) file(dirfd int, name, rel string, st *unix.Stat_t) error {
	// O_NONBLOCK: should the entry have been swapped for a fifo, do not hang (it is then refused below).
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %q: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if err := sameFile(fd, st); err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	if err := unix.Fstat(fd, st); err != nil { // the size of what is read now
		return fmt.Errorf("stat %q: %w", rel, err)
	}
	xattrs, err := listXattrs(fd, "")
	if err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	nseg, data, err := dataSegments(fd, st.Size, nil)
	if err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	if wr.maxData > 0 && wr.stats.Bytes+data > wr.maxData {
		return fmt.Errorf("%q: the files' data pass %d bytes: %w", rel, wr.maxData, unix.EDQUOT)
	}
	if nseg == 1 && data == st.Size || st.Size == 0 {
		// No hole: a plain regular file entry, as every file was before sparse entries existed.
		if err := wr.header(rel, st, tar.TypeReg, "", xattrs, st.Size, nil); err != nil {
			return err
		}
		n, err := io.CopyBuffer(wr.tw, io.NewSectionReader(f, 0, st.Size), wr.buf)
		if err != nil {
			return fmt.Errorf("write %q: %w", rel, err)
		}
		if n != st.Size {
			return fmt.Errorf("write %q: file shrank from %d to %d bytes while being read", rel, st.Size, n)
		}
		wr.stats.Files++
		wr.stats.Bytes += n
		return nil
	}
	return wr.sparseFile(f, rel, st, xattrs, nseg, data)
}

// sparseFile writes the regular file f, which has holes, as a typeSparse entry: a record per data segment
// (segmentRecordSize bytes: offset and length) followed by that segment's bytes, the holes left out. nseg and
// data are its number of segments and their total length, which fix the entry's size before it is written.
func (wr *writer) sparseFile(f *os.File, rel string, st *unix.Stat_t, xattrs map[string]string, nseg, data int64) error {
	size := nseg*segmentRecordSize + data
	records := map[string]string{sparseSizeRecord: strconv.FormatInt(st.Size, 10)}
	if err := wr.header(rel, st, typeSparse, "", xattrs, size, records); err != nil {
		return err
	}
	var rec [segmentRecordSize]byte
	var written, wseg int64
	_, _, err := dataSegments(int(f.Fd()), st.Size, func(off, n int64) error {
		binary.BigEndian.PutUint64(rec[:8], uint64(off))
		binary.BigEndian.PutUint64(rec[8:], uint64(n))
		if wseg++; wseg > nseg {
			return errors.New("file changed while being read (more data segments)")
		}
		if _, err := wr.tw.Write(rec[:]); err != nil {
			return err
		}
		c, err := io.CopyBuffer(wr.tw, io.NewSectionReader(f, off, n), wr.buf)
		written += c
		if err == nil && c != n {
			err = fmt.Errorf("file shrank while being read (segment at %d: %d of %d bytes)", off, c, n)
		}
		return err
	})
	if err == nil && (wseg != nseg || written != data) {
		err = errors.New("file changed while being read (fewer data segments)")
	}
	if err != nil {
		return fmt.Errorf("write %q: %w", rel, err)
	}
	wr.stats.Files++
	wr.stats.Bytes += written
	return nil
}

// dataSegments finds the data segments of the file open at fd, of the given size, with SEEK_DATA and
// SEEK_HOLE, calls each (when not nil) with a segment's offset and length, and returns their number and total
// length. A file system without hole support reports the whole file as one segment. Every segment is at least
// a block of the file system that the layer's quota counts, so the records of a sparse entry add at most
// segmentRecordSize bytes per block: a map of millions of tiny segments needs as many blocks of real data, and
// nothing of it is held in memory.
func dataSegments(fd int, size int64, each func(off, n int64) error) (nseg, total int64, err error) {
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole from off to the end
		}
		if err != nil {
			return 0, 0, fmt.Errorf("seek data: %w", err)
		}
		if start >= size {
			break
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return 0, 0, fmt.Errorf("seek hole: %w", err)
		}
		end = min(end, size)
		if end <= start {
			return 0, 0, fmt.Errorf("seek hole: no progress at offset %d", start)
		}
		if each != nil {
			if err := each(start, end-start); err != nil {
				return 0, 0, err
			}
		}
		nseg++
		total += end - start
		off = end
	}
	return nseg, total, nil
}

func (wr *writer) header(name string, st *unix.Stat_t, typ byte, link string, xattrs map[string]string, size int64, records map[string]string) error {
	hdr := &tar.Header{
		Typeflag: typ,
		Name:     name,
		Linkname: link,
		Size:     size,
		Mode:     int64(st.Mode & 07777),
		Uid:      int(st.Uid),
		Gid:      int(st.Gid),
		ModTime:  mtime(st),
		Format:   tar.FormatPAX,
	}
	if typ == tar.TypeChar || typ == tar.TypeBlock {
		hdr.Devmajor = int64(unix.Major(uint64(st.Rdev)))
		hdr.Devminor = int64(unix.Minor(uint64(st.Rdev)))
	}
	if len(xattrs)+len(records) > 0 {
		hdr.PAXRecords = make(map[string]string, len(xattrs)+len(records))
		maps.Copy(hdr.PAXRecords, records)
		for k, v := range xattrs {
			if strings.ContainsAny(k, "=\x00") {
				return fmt.Errorf("%q: xattr name %q cannot be stored in a tar", name, k)
			}
			hdr.PAXRecords[xattrPrefix+k] = v
		}
	}
	if err := wr.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write header %q: %w", name, err)
	}
	wr.stats.Entries++
	return nil
}

// sameFile checks that fd is the inode that st described (it was not swapped between lstat and open).
func sameFile(fd int, st *unix.Stat_t) error {
	var now unix.Stat_t
	if err := unix.Fstat(fd, &now); err != nil {
		return err
	}
	if now.Dev != st.Dev || now.Ino != st.Ino || now.Mode&unix.S_IFMT != st.Mode&unix.S_IFMT {
		return errors.New("changed while being read")
	}
	return nil
}

func mtime(st *unix.Stat_t) time.Time { return time.Unix(st.Mtim.Sec, st.Mtim.Nsec) }

func readlinkat(dirfd int, name string) (string, error) {
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
