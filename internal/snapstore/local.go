package snapstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/crashpoint"
	"github.com/ramify-dev/ramify/internal/errdefs"
)

// Local is a Store in a directory of the host. Its layout:
//
//	<dir>/objects/<key>   the objects, one file each (mode 0600; directories 0700)
//	<dir>/tmp/            objects being written, renamed into objects/ once complete and fsynced
//	<dir>/sha256/<key>    checksum records, only on file systems without user xattrs
//
// An object's checksum (Sum) is kept in an xattr, "user.ramify.crc32c" (or "user.ramify.sha256", for objects of
// versions before CRC-32C), set before the rename that publishes it, so object and checksum appear together.
// Where the file system has no user xattrs, a sidecar file under sha256/ (named for the checksum it first held)
// holds "crc32c:<hex> <inode>" (or "<sha256 hex> <inode>") and counts only while the inode matches (a crash between the two renames
// then leaves the checksum unknown, never wrong). Every path is resolved through an os.Root at dir, so keys
// (already validated) cannot reach outside it. Because keys map onto directories, a key cannot be both an
// object and a "directory" of others: Put("a/b") while "a" exists fails with errdefs.ErrConflict (S3 has no
// such restriction).
type Local struct {
	dir  string
	root *os.Root
}

const (
	objectsDir  = "objects"
	tmpDir      = "tmp"
	sidecarDir  = "sha256"
	crc32cXattr = "user.ramify.crc32c"
	sha256Xattr = "user.ramify.sha256"
)

// NewLocal opens (creating it if needed) a local store in dir. Temporary files older than a day, left by
// crashes, are removed.
func NewLocal(dir string) (*Local, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: local snapshot store: empty directory", errdefs.ErrInvalid)
	}
	for _, d := range []string{dir, path.Join(dir, objectsDir), path.Join(dir, tmpDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("local snapshot store: %w", err)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("local snapshot store: %w", err)
	}
	l := &Local{dir: dir, root: root}
	if ents, err := os.ReadDir(path.Join(dir, tmpDir)); err == nil {
		for _, e := range ents {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > 24*time.Hour {
				_ = root.Remove(tmpDir + "/" + e.Name())
			}
		}
	}
	return l, nil
}

// Name is "local:<dir>".
func (l *Local) Name() string { return "local:" + l.dir }

// Close releases the store's directory handle.
func (l *Local) Close() error { return l.root.Close() }

func objPath(key string) string { return objectsDir + "/" + key }

// Put writes r to a temporary file, fsyncs it, records its CRC-32C, renames it over the key and fsyncs the
// directories.
func (l *Local) Put(ctx context.Context, key string, r io.Reader) (Object, error) {
	if err := ValidateKey(key); err != nil {
		return Object{}, err
	}
	return l.publish(ctx, key, func(f *os.File) (int64, Sum, error) {
		return fillDirect(ctx, f, r)
	})
}

// publish creates a temporary file, lets fill write it (returning size and checksum), and publishes it as key
// atomically.
func (l *Local) publish(ctx context.Context, key string, fill func(*os.File) (int64, Sum, error)) (obj Object, err error) {
	tmp := tmpDir + "/" + randomName()
	f, err := l.root.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Object{}, fmt.Errorf("put %s: %w", key, err)
	}
	defer func() {
		if f != nil {
			f.Close()
		}
		if err != nil {
			_ = l.root.Remove(tmp)
		}
	}()
	size, sum, err := fill(f)
	if err != nil {
		return Object{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return Object{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := f.Sync(); err != nil {
		return Object{}, fmt.Errorf("put %s: fsync: %w", key, err)
	}
	crashpoint.Hit(crashpoint.SnapshotBeforePublish)
	useSidecar := false
	if err := setSum(f, sum); err != nil {
		if !errors.Is(err, unix.ENOTSUP) {
			return Object{}, fmt.Errorf("put %s: setxattr: %w", key, err)
		}
		useSidecar = true
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return Object{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return Object{}, fmt.Errorf("put %s: %w", key, err)
	}
	f = nil
	if err := l.commit(tmp, key, sum, st.Ino, useSidecar); err != nil {
		return Object{}, err
	}
	return Object{Key: key, Size: size, Sum: sum}, nil
}

// xattrSum returns the checksum f's xattr records, crc32c's or else sha256's: the error of the last lookup when
// neither is there (ENODATA; ENOTSUP where the file system keeps no user xattrs).
func xattrSum(f *os.File) (Sum, error) {
	buf := make([]byte, 128)
	n, err := unix.Fgetxattr(int(f.Fd()), crc32cXattr, buf)
	if err == nil {
		return Sum{CRC32C: string(buf[:n])}, nil
	}
	if !errors.Is(err, unix.ENODATA) {
		return Sum{}, err
	}
	if n, err = unix.Fgetxattr(int(f.Fd()), sha256Xattr, buf); err != nil {
		return Sum{}, err
	}
	return Sum{SHA256: string(buf[:n])}, nil
}

// setSum records sum in f's xattr.
func setSum(f *os.File, sum Sum) error {
	if sum.CRC32C != "" {
		return unix.Fsetxattr(int(f.Fd()), crc32cXattr, []byte(sum.CRC32C), 0)
	}
	return unix.Fsetxattr(int(f.Fd()), sha256Xattr, []byte(sum.SHA256), 0)
}

// commit publishes the written and fsynced temporary file tmp (inode ino, checksum sum) as key: renamed
// over it, its directory fsynced, and, if useSidecar, its checksum recorded beside it. On failure the caller
// removes tmp.
func (l *Local) commit(tmp, key string, sum Sum, ino uint64, useSidecar bool) error {
	if useSidecar {
		// The old record goes first: a crash before the new one is written leaves the checksum unknown.
		if err := l.root.Remove(sidecarDir + "/" + key); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("put %s: %w", key, err)
		}
	}
	dst := objPath(key)
	if err := l.renameInto(tmp, dst); err != nil {
		return l.conflict(key, err)
	}
	if err := l.syncDirs(path.Dir(dst)); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if useSidecar {
		if err := l.writeSidecar(key, sum, ino); err != nil {
			return fmt.Errorf("put %s: checksum record: %w", key, err)
		}
	}
	return nil
}

func (l *Local) conflict(key string, err error) error {
	if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.EEXIST) ||
		errors.Is(err, syscall.ENOTEMPTY) {
		return fmt.Errorf("put %s: %w: a key is in the way (a key cannot be both an object and a prefix of others in a local store): %v",
			key, errdefs.ErrConflict, err)
	}
	return fmt.Errorf("put %s: %w", key, err)
}

// syncDirs fsyncs dir and its ancestors up to the store's root, so that a rename into dir, and any
// directories MkdirAll just created, survive a crash.
func (l *Local) syncDirs(dir string) error {
	for {
		d, err := l.root.Open(dir)
		if err != nil {
			return err
		}
		err = d.Sync()
		d.Close()
		if err != nil {
			return fmt.Errorf("fsync %s: %w", dir, err)
		}
		if dir == "." || dir == objectsDir || dir == sidecarDir {
			return nil
		}
		dir = path.Dir(dir)
	}
}

func (l *Local) writeSidecar(key string, sum Sum, ino uint64) error {
	rec := sum.SHA256
	if sum.CRC32C != "" {
		rec = "crc32c:" + sum.CRC32C
	}
	tmp := tmpDir + "/" + randomName()
	if err := l.root.WriteFile(tmp, fmt.Appendf(nil, "%s %d\n", rec, ino), 0o600); err != nil {
		return err
	}
	dst := sidecarDir + "/" + key
	if err := l.renameInto(tmp, dst); err != nil {
		_ = l.root.Remove(tmp)
		return err
	}
	return l.syncDirs(path.Dir(dst))
}

// renameInto renames tmp to dst, making dst's directory first. A concurrent Delete of another key under the
// same prefix (the previous snapshot of a sandbox, dropped as its next pause writes) prunes directories it left
// empty, which may be the one MkdirAll just made or is making (ENOENT from MkdirAll or from Rename): it tries
// again.
func (l *Local) renameInto(tmp, dst string) error {
	for attempt := 0; ; attempt++ {
		err := l.root.MkdirAll(path.Dir(dst), 0o700)
		if err == nil {
			err = l.root.Rename(tmp, dst)
		}
		if err == nil || !errors.Is(err, fs.ErrNotExist) || attempt == 20 {
			return err
		}
	}
}

// checksum returns the recorded checksum of the open object f (at key): none if unknown.
func (l *Local) checksum(f *os.File, key string) (Sum, error) {
	sum, err := xattrSum(f)
	switch {
	case err == nil:
		return sum, nil
	case errors.Is(err, unix.ENODATA):
		return Sum{}, nil
	case !errors.Is(err, unix.ENOTSUP):
		return Sum{}, fmt.Errorf("getxattr %s: %w", key, err)
	}
	b, err := l.root.ReadFile(sidecarDir + "/" + key)
	if err != nil {
		return Sum{}, nil
	}
	var rec string
	var ino uint64
	if _, err := fmt.Sscanf(string(b), "%s %d", &rec, &ino); err != nil {
		return Sum{}, nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Ino != ino {
		return Sum{}, nil
	}
	if crc, ok := strings.CutPrefix(rec, "crc32c:"); ok {
		return Sum{CRC32C: crc}, nil
	}
	return Sum{SHA256: rec}, nil
}

// open opens the object at key for reading, mapping absence to errdefs.ErrNotFound.
func (l *Local) open(key string) (*os.File, fs.FileInfo, error) {
	if err := ValidateKey(key); err != nil {
		return nil, nil, err
	}
	f, err := l.root.Open(objPath(key))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil, nil, fmt.Errorf("get %s: %w", key, errdefs.ErrNotFound)
		}
		return nil, nil, fmt.Errorf("get %s: %w", key, err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("get %s: %w", key, err)
	}
	if !info.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("get %s: %w", key, errdefs.ErrNotFound)
	}
	return f, info, nil
}

// Get opens the object's file.
func (l *Local) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f, _, err := l.open(key)
	if err != nil {
		return nil, err
	}
	return openDirect(f), nil
}

// OpenFile opens the object's file read-only, for a reader that wants the file itself (the interpreter reads a
// session from it with direct I/O); the caller closes it. errdefs.ErrNotFound when absent.
func (l *Local) OpenFile(ctx context.Context, key string) (*os.File, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f, _, err := l.open(key)
	return f, err
}

// Stat returns the object's size and recorded checksum.
func (l *Local) Stat(ctx context.Context, key string) (Object, error) {
	if err := ctx.Err(); err != nil {
		return Object{}, err
	}
	f, info, err := l.open(key)
	if err != nil {
		return Object{}, err
	}
	defer f.Close()
	sum, err := l.checksum(f, key)
	if err != nil {
		return Object{}, err
	}
	return Object{Key: key, Size: info.Size(), Sum: sum}, nil
}

// Copy reflinks src to a temporary file (FICLONE: O(1) on btrfs and XFS), or copies it where the file
// system cannot, and publishes it as dst like Put. The checksum is carried over from src (computed while
// copying if src has none).
func (l *Local) Copy(ctx context.Context, src, dst string) error {
	if err := ValidateKey(dst); err != nil {
		return err
	}
	in, info, err := l.open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	sum, err := l.checksum(in, src)
	if err != nil {
		return err
	}
	if sum.Known() {
		if err := l.link(src, dst, sum, in); err == nil {
			return nil
		} else if !errors.Is(err, errNoLink) {
			return fmt.Errorf("copy %s to %s: %w", src, dst, err)
		}
	}
	_, err = l.publish(ctx, dst, func(out *os.File) (int64, Sum, error) {
		if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err == nil {
			if sum.Known() {
				return info.Size(), sum, nil
			}
			h := NewCRC32C()
			n, err := io.Copy(h, ctxReader{ctx, in})
			return n, Sum{}.Of(h), err
		}
		if sum.Known() {
			// *os.File to *os.File: copy_file_range, which may share extents itself.
			n, err := io.Copy(out, in)
			if err == nil && n != info.Size() {
				err = fmt.Errorf("copied %d bytes of %d: source changed", n, info.Size())
			}
			return n, sum, err
		}
		h := NewCRC32C()
		n, err := io.CopyBuffer(io.MultiWriter(out, h), ctxReader{ctx, in}, make([]byte, 1<<20))
		return n, Sum{}.Of(h), err
	})
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}

// errNoLink says the store's file system makes no hard links (Copy then copies).
var errNoLink = errors.New("no hard links here")

// link publishes the object src (open as in, its checksum sum known) as dst by a hard link to its file:
// objects never change once published (a Put over a key renames a new file over it; a Delete unlinks), so two
// keys may share one, and a copy of a 1 GiB session (a fork of a paused sandbox) takes no time and no space
// where the file system shares no extents (ext4: copy_file_range copied it, ~2.6 s here). The checksum goes
// with the file (its xattr) or is recorded for dst's key (the sidecar names the inode). errNoLink where links
// cannot be made, or src's key no longer names the file opened.
func (l *Local) link(src, dst string, sum Sum, in *os.File) error {
	if err := ValidateKey(dst); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(in.Fd()), &st); err != nil {
		return err
	}
	tmp := tmpDir + "/" + randomName()
	if err := l.root.Link(objPath(src), tmp); err != nil {
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EXDEV) || errors.Is(err, syscall.EMLINK) ||
			errors.Is(err, syscall.ENOTSUP) || errors.Is(err, fs.ErrNotExist) {
			return errNoLink // (gone since it was opened: copied from the open file as before)
		}
		return err
	}
	// The same file, not a replacement published over src since it was opened.
	fi, err := l.root.Lstat(tmp)
	if err != nil {
		_ = l.root.Remove(tmp)
		return err
	}
	if lst, ok := fi.Sys().(*syscall.Stat_t); !ok || lst.Ino != st.Ino || lst.Dev != st.Dev {
		_ = l.root.Remove(tmp)
		return errNoLink
	}
	_, xerr := xattrSum(in)
	if err := l.commit(tmp, dst, sum, st.Ino, xerr != nil); err != nil {
		_ = l.root.Remove(tmp)
		return err
	}
	return nil
}

// Delete removes the objects under prefix and prunes directories left empty.
func (l *Local) Delete(ctx context.Context, prefix string) error {
	if prefix == "" {
		return fmt.Errorf("%w: delete: empty prefix", errdefs.ErrInvalid)
	}
	objs, err := l.List(ctx, prefix)
	if err != nil {
		return err
	}
	dirs := map[string]bool{}
	for _, o := range objs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := l.root.Remove(objPath(o.Key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("delete %s: %w", o.Key, err)
		}
		if err := l.root.Remove(sidecarDir + "/" + o.Key); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("delete %s: %w", o.Key, err)
		}
		for d := path.Dir(o.Key); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	// Deepest first; a directory that is not empty (other keys, or a concurrent Put) stays.
	sorted := make([]string, 0, len(dirs))
	for d := range dirs {
		sorted = append(sorted, d)
	}
	sort.Slice(sorted, func(i, j int) bool { return len(sorted[i]) > len(sorted[j]) })
	for _, d := range sorted {
		_ = l.root.Remove(objPath(d))
		_ = l.root.Remove(sidecarDir + "/" + d)
	}
	if len(objs) > 0 {
		if err := l.syncDirs(objectsDir); err != nil {
			return fmt.Errorf("delete %s: %w", prefix, err)
		}
	}
	return nil
}

// List walks the objects directory below the longest directory part of prefix.
func (l *Local) List(ctx context.Context, prefix string) ([]Object, error) {
	if err := validatePrefix(prefix); err != nil {
		return nil, err
	}
	start := objectsDir
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		start = objPath(prefix[:i])
	}
	out := []Object{}
	err := fs.WalkDir(l.root.FS(), start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == start && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)) {
				return fs.SkipAll
			}
			if errors.Is(err, fs.ErrNotExist) {
				return nil // deleted meanwhile
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		key := strings.TrimPrefix(p, objectsDir+"/")
		if d.IsDir() {
			// Prune directories that cannot hold matching keys.
			if p != start && !strings.HasPrefix(key+"/", prefix) && !strings.HasPrefix(prefix, key+"/") {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !strings.HasPrefix(key, prefix) {
			return nil
		}
		o, err := l.Stat(ctx, key)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		out = append(out, o)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// RemoveTemps removes every temporary file of an unfinished Put, Copy or checksum record, and the empty
// directories a Delete cut short left (its objects removed, not yet their directories), and returns how many
// files there were. Only for a store no other process writes to (the data directory's own, at start-up):
// another writer's temporary files would go too.
func (l *Local) RemoveTemps() (int, error) {
	ents, err := os.ReadDir(path.Join(l.dir, tmpDir))
	if err != nil {
		return 0, fmt.Errorf("remove temporary files: %w", err)
	}
	n := 0
	var errs []error
	for _, e := range ents {
		if err := l.root.RemoveAll(tmpDir + "/" + e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	for _, top := range []string{objectsDir, sidecarDir} {
		errs = append(errs, l.pruneEmptyDirs(top))
	}
	return n, errors.Join(errs...)
}

// pruneEmptyDirs removes the empty directories below top (deepest first, so that a directory holding only empty
// ones goes too); top stays.
func (l *Local) pruneEmptyDirs(top string) error {
	var dirs []string
	err := fs.WalkDir(l.root.FS(), top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() && p != top {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("prune empty directories: %w", err)
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, d := range dirs {
		_ = l.root.Remove(d) // one that is not empty stays
	}
	return nil
}

// tmpObjects lists the temporary files of unfinished Puts (for tests).
func (l *Local) tmpObjects(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(path.Join(l.dir, tmpDir))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, nil
}
