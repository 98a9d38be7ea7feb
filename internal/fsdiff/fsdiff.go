// Package fsdiff compares the file systems of two sandboxes from the host, using only their overlay layers:
// what a sandbox sees at a path is its writable (upper) layer's entry if there is one — a whiteout meaning
// "deleted", an opaque directory hiding the image below — else the shared read-only image's (lower) entry. Paths
// that neither upper layer touches are equal by construction, so only what changed since the image needs a look.
// When both upper layers are btrfs layers with a common history (fork), only inodes changed since that history
// are looked at (changes.go): a file both inherited and neither changed is equal without reading it. Everything
// else that could differ is compared by content.
package fsdiff

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Result lists paths of b relative to a: present only in b, only in a, and in both with different content.
type Result struct {
	Added    []string `json:"added"`
	Removed  []string `json:"removed"`
	Modified []string `json:"modified"`
	// Truncated is true when the comparison stopped because a list reached MaxEntries: the lists then hold
	// the differences among the paths that sort before where it stopped, and nothing after.
	Truncated bool `json:"truncated,omitempty"`
}

// MaxEntries bounds each list of a Result (a diff of 300,000 files was 7 MB of JSON and seconds of work).
const MaxEntries = 10000

// maxEntries is MaxEntries; tests lower it.
var maxEntries = MaxEntries

// Layers are one sandbox's layers on the host.
type Layers struct {
	Upper string // the overlay upper directory
	Lower string // the image (the default image, under a named image's own layers)
	// Over are a named image's own layers above Lower, top first (overlay lower dirs, whiteouts and opaque
	// directories included); empty for the default image.
	Over []string
}

// lowers are the image's layers, top first.
func (l Layers) lowers() []string { return append(append([]string(nil), l.Over...), l.Lower) }

// Compare returns the differences of b relative to a under paths (absolute, inside the sandboxes). Only
// non-directory entries (regular files, symlinks, others) are reported.
func Compare(a, b Layers, paths []string) (Result, error) {
	if !slices.Equal(a.lowers(), b.lowers()) {
		return compareWalk(a, b, paths) // different images: their files are candidates too
	}
	if res, ok, err := compareChanges(a, b, paths); ok || err != nil {
		return res, err
	}
	return compareWalk(a, b, paths)
}

// compareWalk compares a and b by walking both upper layers under paths.
func compareWalk(a, b Layers, paths []string) (Result, error) {
	res := Result{Added: []string{}, Removed: []string{}, Modified: []string{}}
	va, vb := newView(a), newView(b)
	// The two layers are read concurrently.
	candA, candB := map[string]bool{}, map[string]bool{}
	var errA error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, p := range paths {
			if errA = va.collect(p, candA); errA != nil {
				return
			}
		}
	}()
	for _, p := range paths {
		if err := vb.collect(p, candB); err != nil {
			<-done
			return res, err
		}
	}
	<-done
	if errA != nil {
		return res, errA
	}
	cands := candA
	for n := range candB {
		cands[n] = true
	}
	if !slices.Equal(a.lowers(), b.lowers()) {
		// Sandboxes on different images: whatever either image holds may differ (the layers' whole trees
		// under paths; files both images share by path compare equal at once).
		for _, p := range paths {
			lowerTree(a, p, cands)
			lowerTree(b, p, cands)
		}
	}
	// Without a common history nothing says whether two files with one inode number are one snapshot-shared
	// inode (btrfs numbers inodes per subvolume, so numbers collide): compare contents.
	return diffNames(va, vb, sortedNames(cands), nil)
}

// resolver tells what a sandbox sees at a path.
type resolver interface {
	// resolve returns what the sandbox sees at rel: nil when nothing, or a directory.
	resolve(rel string) (*entry, error)
}

func sortedNames(set map[string]bool) []string {
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// diffNames compares what a and b see at each of names (sorted). shared, if not nil, reports whether two upper
// layer entries are one inode inherited unchanged from the common history, hence equal without reading them.
func diffNames(a, b resolver, names []string, shared func(ea, eb *entry) bool) (Result, error) {
	res := Result{Added: []string{}, Removed: []string{}, Modified: []string{}}
	for _, n := range names {
		if len(res.Added) >= maxEntries || len(res.Removed) >= maxEntries || len(res.Modified) >= maxEntries {
			res.Truncated = true
			break
		}
		ea, err := a.resolve(n)
		if err != nil {
			return res, err
		}
		eb, err := b.resolve(n)
		if err != nil {
			return res, err
		}
		switch {
		case ea == nil && eb == nil:
		case ea == nil:
			res.Added = append(res.Added, n)
		case eb == nil:
			res.Removed = append(res.Removed, n)
		default:
			same, err := equal(ea, eb, shared)
			if err != nil {
				return res, err
			}
			if !same {
				res.Modified = append(res.Modified, n)
			}
		}
	}
	return res, nil
}

// entry is what a sandbox sees at a path: a non-directory at a host path.
type entry struct {
	host  string
	st    unix.Stat_t
	upper bool // host is in the upper layer
}

// view is one sandbox's upper layer as read by collect: its non-directory entries (whiteouts included) and
// its directories with their opaque flag.
type view struct {
	l      Layers
	files  map[string]unix.Stat_t
	dirs   map[string]bool // rel -> opaque
	hidden map[string]bool // walked roots whose image content is hidden by an ancestor in the upper layer
}

func newView(l Layers) *view {
	return &view{l: l, files: map[string]unix.Stat_t{}, dirs: map[string]bool{}, hidden: map[string]bool{}}
}

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func isOpaque(p string) bool {
	buf := make([]byte, 4)
	for _, name := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if n, err := unix.Lgetxattr(p, name, buf); err == nil && n == 1 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

func lstat(p string) (*unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return nil, nil
		}
		return nil, fmt.Errorf("lstat %s: %w", p, err)
	}
	return &st, nil
}

func (v *view) rel(hp string) string {
	return "/" + strings.TrimPrefix(strings.TrimPrefix(hp, v.l.Upper), "/")
}

// collect walks the upper layer under p, recording what it holds, and adds to cands every non-directory path
// it touches and, under directories it makes opaque or deletes, every path of the image below them (they differ
// from a sandbox that does not).
func (v *view) collect(p string, cands map[string]bool) error {
	root := filepath.Join(v.l.Upper, p)
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case err == nil:
		err = v.walk(fd, p, cands)
		if err != nil {
			return err
		}
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
		// p is absent from the upper layer, or is not a directory there.
		if st, _ := lstat(root); st != nil {
			v.files[p] = *st
			cands[p] = true
			lowerTree(v.l, p, cands) // an image directory p replaced or deleted: its files are hidden
		}
	default:
		return fmt.Errorf("open %s: %w", root, err)
	}
	// An ancestor of p may be opaque or deleted in the upper layer; then the image's files under p are hidden.
	for dir := path.Dir(p); dir != p; dir = path.Dir(dir) {
		hp := filepath.Join(v.l.Upper, dir)
		if st, _ := lstat(hp); st != nil && (!isDir(st) || isOpaque(hp)) {
			v.hidden[p] = true
			lowerTree(v.l, p, cands)
			break
		}
		if dir == "/" {
			break
		}
	}
	return nil
}

// walk records the directory open at fd (path rel) and everything below it, with *at calls relative to each
// directory's fd: no path is resolved twice and no symlink is followed. It closes fd.
func (v *view) walk(fd int, rel string, cands map[string]bool) error {
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	op := fopaque(fd)
	v.dirs[rel] = op
	cands[rel] = true // a directory hides an image file of the same name
	if op {
		lowerTree(v.l, rel, cands)
	}
	ents, err := f.ReadDir(-1)
	if err != nil {
		return fmt.Errorf("read %s: %w", filepath.Join(v.l.Upper, rel), err)
	}
	var lowerDirs map[string]bool
	for _, e := range ents {
		child := path.Join(rel, e.Name())
		if e.IsDir() {
			cfd, err := unix.Openat(fd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open %s: %w", filepath.Join(v.l.Upper, child), err)
			}
			if err := v.walk(cfd, child, cands); err != nil {
				return err
			}
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stat %s: %w", filepath.Join(v.l.Upper, child), err)
		}
		v.files[child] = st
		cands[child] = true
		if lowerDirs == nil {
			lowerDirs = lowerSubdirs(v.l, rel)
		}
		if lowerDirs[e.Name()] {
			lowerTree(v.l, child, cands) // a deleted or replaced image directory hides its whole subtree
		}
	}
	return nil
}

func fopaque(fd int) bool {
	buf := make([]byte, 4)
	for _, name := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if n, err := unix.Fgetxattr(fd, name, buf); err == nil && n == 1 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

// subdirs is the set of names of the directories in dir (none if dir is missing).
func subdirs(dir string) map[string]bool {
	set := map[string]bool{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			set[e.Name()] = true
		}
	}
	return set
}

// lowerSubdirs are the directories of the image's layers at rel (a superset of what the image shows).
func lowerSubdirs(l Layers, rel string) map[string]bool {
	set := map[string]bool{}
	for _, lower := range l.lowers() {
		for d := range subdirs(filepath.Join(lower, rel)) {
			set[d] = true
		}
	}
	return set
}

// lowerTree adds every non-directory of the image's layers at or below rel to cands (a superset of what the
// image shows there: candidates are resolved one by one).
func lowerTree(l Layers, rel string, cands map[string]bool) {
	for _, lower := range l.lowers() {
		lowerTree1(lower, rel, cands)
	}
}

func lowerTree1(lower, rel string, cands map[string]bool) {
	root := filepath.Join(lower, rel)
	filepath.WalkDir(root, func(hp string, d fs.DirEntry, err error) error { //nolint:errcheck // best effort: missing is fine
		if err != nil {
			return nil
		}
		if !d.IsDir() {
			cands["/"+strings.TrimPrefix(strings.TrimPrefix(hp, lower), "/")] = true
		}
		return nil
	})
}

// resolve returns what the sandbox sees at rel (nil when nothing, or a directory). rel lies under a path that
// collect walked.
func (v *view) resolve(rel string) (*entry, error) {
	if st, ok := v.files[rel]; ok {
		if isWhiteout(&st) {
			return nil, nil
		}
		return &entry{host: filepath.Join(v.l.Upper, rel), st: st, upper: true}, nil
	}
	if _, ok := v.dirs[rel]; ok {
		return nil, nil
	}
	// Not in the upper layer: the image shows through unless an ancestor is deleted, a file, or opaque.
	if v.hidden[rel] {
		return nil, nil
	}
	for dir := path.Dir(rel); ; dir = path.Dir(dir) {
		if _, ok := v.files[dir]; ok {
			return nil, nil
		}
		if v.dirs[dir] || v.hidden[dir] {
			return nil, nil
		}
		if dir == "/" {
			break
		}
	}
	return lowerEntry(v.l, rel)
}

// lowerEntry is the image's non-directory at rel, if any.
func lowerEntry(l Layers, rel string) (*entry, error) {
	lowers := l.lowers()
	for i, lower := range lowers {
		hp := filepath.Join(lower, rel)
		st, err := lstat(hp)
		if err != nil {
			return nil, err
		}
		if st != nil {
			if isDir(st) || isWhiteout(st) {
				return nil, nil
			}
			return &entry{host: hp, st: *st}, nil
		}
		if i < len(lowers)-1 && hidesBelow(lower, rel) {
			return nil, nil
		}
	}
	return nil, nil
}

// hidesBelow reports whether an image layer hides the layers below it at rel: an ancestor of rel is deleted
// (a whiteout), not a directory, or an opaque directory there.
func hidesBelow(lower, rel string) bool {
	for dir := path.Dir(rel); ; dir = path.Dir(dir) {
		hd := filepath.Join(lower, dir)
		if st, _ := lstat(hd); st != nil && (!isDir(st) || isOpaque(hd)) {
			return true
		}
		if dir == "/" {
			return false
		}
	}
}

func isDir(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFDIR }

func equal(a, b *entry, shared func(a, b *entry) bool) (bool, error) {
	if a.host == b.host {
		return true, nil // both see the image's file
	}
	if a.st.Mode&unix.S_IFMT != b.st.Mode&unix.S_IFMT {
		return false, nil
	}
	switch a.st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		ta, err := os.Readlink(a.host)
		if err != nil {
			return false, err
		}
		tb, err := os.Readlink(b.host)
		return err == nil && ta == tb, err
	case unix.S_IFREG:
	default:
		return a.st.Rdev == b.st.Rdev, nil
	}
	if a.st.Size != b.st.Size {
		return false, nil
	}
	if shared != nil && a.upper && b.upper && shared(a, b) {
		return true, nil
	}
	return sameContent(a.host, b.host, a.st.Size)
}

// bufPool holds pairs of read buffers for sameContent.
var bufPool = sync.Pool{New: func() any { return new([2][64 << 10]byte) }}

// sameContent compares two regular files of the given size byte by byte, stopping at the first difference.
func sameContent(pa, pb string, size int64) (bool, error) {
	var fds [2]int
	for i, p := range []string{pa, pb} {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			if i == 1 {
				unix.Close(fds[0])
			}
			return false, fmt.Errorf("open %s: %w", p, err)
		}
		fds[i] = fd
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	bufs := bufPool.Get().(*[2][64 << 10]byte)
	defer bufPool.Put(bufs)
	for left := size; left > 0; {
		n := int(min(left, int64(len(bufs[0]))))
		for i, p := range []string{pa, pb} {
			if err := readFull(fds[i], bufs[i][:n]); err != nil {
				return false, fmt.Errorf("read %s: %w", p, err)
			}
		}
		if !bytes.Equal(bufs[0][:n], bufs[1][:n]) {
			return false, nil
		}
		left -= int64(n)
	}
	return true, nil
}

// readFull fills b from fd; a file that ends early (changed under us) is io.ErrUnexpectedEOF.
func readFull(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Read(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		b = b[n:]
	}
	return nil
}
