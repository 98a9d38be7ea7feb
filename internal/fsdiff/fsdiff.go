// Package fsdiff compares the file systems of two sandboxes from the host, using only their overlay layers:
// what a sandbox sees at a path is its writable (upper) layer's entry if there is one — a whiteout meaning
// "deleted", an opaque directory or any non-directory hiding the image below — else the shared read-only image's
// (lower) entry. Paths that neither upper layer touches are equal by construction, so only what changed since the
// image needs a look. When both upper layers are btrfs layers with a common history (fork), only inodes changed
// since that history are looked at (changes.go): a file both inherited and neither changed is equal without
// reading it. Everything else that could differ is compared by content (content.go), holes skipped, within
// MaxContentBytes. A comparison stops when its context ends (a delete of either sandbox, a client gone).
//
// The upper layers are written by the sandboxes' (hostile) code, and the server reads them as root: every path
// inside a layer is resolved from that layer's directory fd, never through a symlink (tree.go). A symlink in a
// sandbox is an entry compared by its target, not a directory to look into.
package fsdiff

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/rawname"
)

// Result lists paths of b relative to a: present only in b, only in a, and in both with different content.
type Result struct {
	Added    []string `json:"added"`
	Removed  []string `json:"removed"`
	Modified []string `json:"modified"`
	// Truncated is true when the comparison stopped before its end, because a list reached MaxEntries or the
	// contents compared reached MaxContentBytes: the lists then hold the differences among the paths that sort
	// before where it stopped, and nothing after.
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

// side is one sandbox's layers, open for one comparison.
type side struct {
	Layers
	upper  *tree
	lowers []*tree // top first
}

// comparison is the state of one Compare call: what ends it, and the file content it may still read.
type comparison struct {
	ctx  context.Context
	left int64 // bytes of file content left to read (maxContentBytes at the start)
}

// Compare returns the differences of b relative to a under paths (absolute, inside the sandboxes). Only
// non-directory entries (regular files, symlinks, others) are reported. It returns ctx's error when ctx ends.
func Compare(ctx context.Context, a, b Layers, paths []string) (Result, error) {
	sa, sb, closeAll, err := openSides(a, b)
	if err != nil {
		return Result{}, err
	}
	defer closeAll()
	c := &comparison{ctx: ctx, left: maxContentBytes}
	if slices.Equal(a.lowers(), b.lowers()) { // on different images, the images' files are candidates too
		if res, ok, err := compareChanges(c, sa, sb, paths); ok || err != nil {
			return res, err
		}
	}
	return compareWalk(c, sa, sb, paths)
}

// openSides opens the layers of a and b (a layer both use, once: one tree is one layer); closeAll closes them.
func openSides(a, b Layers) (sa, sb *side, closeAll func(), err error) {
	open := map[string]*tree{}
	closeAll = func() {
		for _, t := range open {
			t.close()
		}
	}
	get := func(dir, name string) (*tree, error) {
		if t, ok := open[dir]; ok {
			return t, nil
		}
		t, err := openTree(dir, name)
		if err != nil {
			return nil, err
		}
		open[dir] = t
		return t, nil
	}
	sides := [2]*side{{Layers: a}, {Layers: b}}
	for i, s := range sides {
		if s.upper, err = get(s.Upper, []string{"a", "b"}[i]+"'s writable layer"); err != nil {
			closeAll()
			return nil, nil, nil, err
		}
		for _, dir := range s.Layers.lowers() {
			t, err := get(dir, "the image")
			if err != nil {
				closeAll()
				return nil, nil, nil, err
			}
			s.lowers = append(s.lowers, t)
		}
	}
	return sides[0], sides[1], closeAll, nil
}

// compareWalk compares a and b by walking both upper layers under paths.
func compareWalk(c *comparison, a, b *side, paths []string) (Result, error) {
	res := Result{Added: []string{}, Removed: []string{}, Modified: []string{}}
	va, vb := newView(c, a), newView(c, b)
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
	if !slices.Equal(a.Layers.lowers(), b.Layers.lowers()) {
		// Sandboxes on different images: whatever either image holds may differ (the layers' whole trees
		// under paths; files both images share by path compare equal at once).
		for _, p := range paths {
			if err := lowerTree(c.ctx, a, p, cands); err != nil {
				return res, err
			}
			if err := lowerTree(c.ctx, b, p, cands); err != nil {
				return res, err
			}
		}
	}
	// Without a common history nothing says whether two files with one inode number are one snapshot-shared
	// inode (btrfs numbers inodes per subvolume, so numbers collide): compare contents.
	return diffNames(c, va, vb, sortedNames(cands), nil)
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
func diffNames(c *comparison, a, b resolver, names []string, shared func(ea, eb *entry) bool) (Result, error) {
	res := Result{Added: []string{}, Removed: []string{}, Modified: []string{}}
	for _, n := range names {
		if len(res.Added) >= maxEntries || len(res.Removed) >= maxEntries || len(res.Modified) >= maxEntries {
			res.Truncated = true
			break
		}
		if err := c.ctx.Err(); err != nil {
			return res, err
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
			same, err := equal(c, ea, eb, shared)
			if errors.Is(err, errContentBudget) {
				res.Truncated = true // n is undecided: the lists stop before it
				return res, nil
			}
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

// entry is what a sandbox sees at a path: a non-directory at rel of a layer.
type entry struct {
	t     *tree
	rel   string
	st    unix.Stat_t
	upper bool // t is the upper layer
}

// view is one sandbox's upper layer as read by collect: its non-directory entries (whiteouts included) and
// its directories with their opaque flag.
type view struct {
	c      *comparison
	s      *side
	files  map[string]unix.Stat_t
	dirs   map[string]bool // rel -> opaque
	hidden map[string]bool // walked roots whose image content is hidden by an ancestor in the upper layer
}

func newView(c *comparison, s *side) *view {
	return &view{c: c, s: s, files: map[string]unix.Stat_t{}, dirs: map[string]bool{}, hidden: map[string]bool{}}
}

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// collect walks the upper layer under p, recording what it holds, and adds to cands every non-directory path
// it touches and, under directories it makes opaque or deletes, every path of the image below them (they differ
// from a sandbox that does not).
func (v *view) collect(p string, cands map[string]bool) error {
	up := v.s.upper
	fd, err := up.openDir(p)
	switch {
	case err == nil:
		if err := v.walk(fd, p, cands); err != nil {
			return err
		}
	case absent(err):
		// p is absent from the upper layer, or is not a directory there, or lies below a non-directory.
		st, err := up.lstat(p)
		if err != nil {
			return err
		}
		if st != nil {
			v.files[p] = *st
			cands[p] = true
			// An image directory p replaced or deleted: its files are hidden.
			if err := lowerTree(v.c.ctx, v.s, p, cands); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("open %s: %w", up.at(p), err)
	}
	// An ancestor of p may be opaque, deleted or not a directory in the upper layer; then the image's files
	// under p are hidden.
	for dir := path.Dir(p); dir != p; dir = path.Dir(dir) {
		st, err := up.lstat(dir)
		if err != nil {
			return err
		}
		if up.hides(dir, st) {
			v.hidden[p] = true
			return lowerTree(v.c.ctx, v.s, p, cands)
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
	if err := v.c.ctx.Err(); err != nil {
		return err
	}
	op := fopaque(fd)
	v.dirs[rel] = op
	cands[rel] = true // a directory hides an image file of the same name
	if op {
		if err := lowerTree(v.c.ctx, v.s, rel, cands); err != nil {
			return err
		}
	}
	ents, err := f.ReadDir(-1)
	if err != nil {
		return fmt.Errorf("read %s: %w", v.s.upper.at(rel), err)
	}
	var lowerDirs map[string]bool
	for _, e := range ents {
		child := path.Join(rel, e.Name())
		if e.IsDir() {
			cfd, err := unix.Openat(fd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open %s: %w", v.s.upper.at(child), err)
			}
			if err := v.walk(cfd, child, cands); err != nil {
				return err
			}
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stat %s: %w", v.s.upper.at(child), err)
		}
		v.files[child] = st
		cands[child] = true
		if lowerDirs == nil {
			if lowerDirs, err = lowerSubdirs(v.s, rel); err != nil {
				return err
			}
		}
		if lowerDirs[e.Name()] {
			// A deleted or replaced image directory hides its whole subtree.
			if err := lowerTree(v.c.ctx, v.s, child, cands); err != nil {
				return err
			}
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

// lowerSubdirs are the directories of the image's layers at rel (a superset of what the image shows).
func lowerSubdirs(s *side, rel string) (map[string]bool, error) {
	set := map[string]bool{}
	for _, t := range s.lowers {
		fd, err := t.openDir(rel)
		if err != nil {
			if absent(err) {
				continue
			}
			return nil, fmt.Errorf("open %s: %w", t.at(rel), err)
		}
		f := os.NewFile(uintptr(fd), rel)
		ents, err := f.ReadDir(-1)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", t.at(rel), err)
		}
		for _, e := range ents {
			if e.IsDir() {
				set[e.Name()] = true
			}
		}
	}
	return set, nil
}

// lowerTree adds every non-directory of the image's layers at or below rel to cands (a superset of what the
// image shows there: candidates are resolved one by one).
func lowerTree(ctx context.Context, s *side, rel string, cands map[string]bool) error {
	for _, t := range s.lowers {
		fd, err := t.openDir(rel)
		if err == nil {
			err = treeNames(ctx, t, fd, rel, cands)
		} else if absent(err) {
			// No directory at rel in this layer: a non-directory there is a candidate itself.
			var st *unix.Stat_t
			if st, err = t.lstat(rel); st != nil {
				cands[rel] = true
			}
		} else {
			err = fmt.Errorf("open %s: %w", t.at(rel), err)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// treeNames adds every non-directory below the directory open at fd (path rel of t) to cands. It closes fd.
func treeNames(ctx context.Context, t *tree, fd int, rel string, cands map[string]bool) error {
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if err := ctx.Err(); err != nil {
		return err
	}
	ents, err := f.ReadDir(-1)
	if err != nil {
		return fmt.Errorf("read %s: %w", t.at(rel), err)
	}
	for _, e := range ents {
		child := path.Join(rel, e.Name())
		if !e.IsDir() {
			cands[child] = true
			continue
		}
		cfd, err := unix.Openat(fd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", t.at(child), err)
		}
		if err := treeNames(ctx, t, cfd, child, cands); err != nil {
			return err
		}
	}
	return nil
}

// resolve returns what the sandbox sees at rel (nil when nothing, or a directory). rel lies under a path that
// collect walked.
func (v *view) resolve(rel string) (*entry, error) {
	if st, ok := v.files[rel]; ok {
		if isWhiteout(&st) {
			return nil, nil
		}
		return &entry{t: v.s.upper, rel: rel, st: st, upper: true}, nil
	}
	if _, ok := v.dirs[rel]; ok {
		return nil, nil
	}
	// Not in the upper layer: the image shows through unless an ancestor is deleted, not a directory, or opaque.
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
	return lowerEntry(v.s, rel)
}

// lowerEntry is the image's non-directory at rel, if any.
func lowerEntry(s *side, rel string) (*entry, error) {
	for i, t := range s.lowers {
		st, err := t.lstat(rel)
		if err != nil {
			return nil, err
		}
		if st != nil {
			if isDir(st) || isWhiteout(st) {
				return nil, nil
			}
			return &entry{t: t, rel: rel, st: *st}, nil
		}
		if i < len(s.lowers)-1 {
			if hides, err := hidesBelow(t, rel); hides || err != nil {
				return nil, err
			}
		}
	}
	return nil, nil
}

// hidesBelow reports whether a layer hides the layers below it at rel: an ancestor of rel is deleted (a
// whiteout), not a directory (a symlink included), or an opaque directory there.
func hidesBelow(t *tree, rel string) (bool, error) {
	for dir := path.Dir(rel); ; dir = path.Dir(dir) {
		st, err := t.lstat(dir)
		if err != nil {
			return false, err
		}
		if t.hides(dir, st) {
			return true, nil
		}
		if dir == "/" {
			return false, nil
		}
	}
}

func isDir(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFDIR }

func equal(c *comparison, a, b *entry, shared func(a, b *entry) bool) (bool, error) {
	if a.t == b.t && a.rel == b.rel {
		return true, nil // both see the image's file
	}
	if a.st.Mode&unix.S_IFMT != b.st.Mode&unix.S_IFMT {
		return false, nil
	}
	switch a.st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		ta, err := a.t.readlink(a.rel)
		if err != nil {
			return false, err
		}
		tb, err := b.t.readlink(b.rel)
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
	return sameContent(c, a, b)
}

// MarshalJSON writes the result in the API's form (rawname.Lists): a path whose bytes are not valid UTF-8 is
// listed in its display form (rawname.Display), and the list's _b64 twin holds its bytes at the same index.
func (r Result) MarshalJSON() ([]byte, error) {
	return json.Marshal(rawname.EncodeLists(nonNil(r.Added), nonNil(r.Removed), nonNil(r.Modified), r.Truncated))
}

// UnmarshalJSON reads the API's form back into raw paths.
func (r *Result) UnmarshalJSON(b []byte) error {
	var j rawname.Lists
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	var out Result
	var err error
	if out.Added, out.Removed, out.Modified, err = j.Decode(); err != nil {
		return err
	}
	out.Truncated = j.Truncated
	*r = out
	return nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
