package fsdiff

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/layer"
)

// changeLimit bounds the changed inodes per side compareChanges keeps in memory; beyond it, it walks.
const changeLimit = 1 << 20

// compareChanges compares a and b through only the inodes changed since their common history, when both upper
// layers lie in btrfs layers (the directory above Upper) that share history. ok is false when they do not, or
// when too much changed: the caller then walks.
//
// An entry that neither side changed since the common generation is the same inode in both, so it cannot differ;
// what can differ lies at the path of a changed inode (on either side), or is an entry of a directory changed on
// either side (an added, deleted or renamed name), or lies below such an entry where it is a directory on one side
// only, or is the image's content below a deleted or opaque directory.
func compareChanges(c *comparison, a, b *side, paths []string) (Result, bool, error) {
	la, lb := filepath.Dir(a.Upper), filepath.Dir(b.Upper)
	gen, ok, err := layer.CommonGeneration(la, lb)
	if err != nil || !ok {
		return Result{}, false, nil
	}
	var ca, cb []layer.Change
	var okA, okB bool
	var errA, errB error
	var wg sync.WaitGroup
	wg.Go(func() { ca, okA, errA = layer.ChangedSince(la, gen, changeLimit) })
	cb, okB, errB = layer.ChangedSince(lb, gen, changeLimit)
	wg.Wait()
	if errA != nil || errB != nil || !okA || !okB {
		return Result{}, false, nil
	}
	s := &changeScan{c: c, a: a, b: b, paths: paths, cands: map[string]bool{}, seen: map[string]bool{}, listed: map[string]bool{}}
	for _, side := range []struct {
		upper   string
		changes []layer.Change
	}{{a.Upper, ca}, {b.Upper, cb}} {
		base := filepath.Base(side.upper)
		for _, c := range side.changes {
			rel, ok := underUpper(c.Path, base)
			if !ok {
				continue // the layer's own directory, the overlay's work directory
			}
			if err := s.touch(rel, c.Dir); err != nil {
				return Result{}, true, err
			}
		}
	}
	// Two upper entries with one inode number that neither side changed are the inode both inherited.
	changed := map[uint64]bool{}
	for _, cs := range [][]layer.Change{ca, cb} {
		for _, c := range cs {
			changed[c.Ino] = true
		}
	}
	shared := func(ea, eb *entry) bool { return ea.st.Ino == eb.st.Ino && !changed[ea.st.Ino] }
	names := make(map[string]bool, len(s.cands))
	for n := range s.cands {
		if s.wanted(n) {
			names[n] = true
		}
	}
	res, err := diffNames(c, lazyView{a}, lazyView{b}, sortedNames(names), shared)
	return res, true, err
}

// underUpper maps a path relative to the layer directory to the sandbox path it holds, if it lies in the upper
// directory named base.
func underUpper(p, base string) (string, bool) {
	if p == base {
		return "/", true
	}
	if rest, ok := strings.CutPrefix(p, base+"/"); ok {
		return "/" + rest, true
	}
	return "", false
}

// within reports whether p lies strictly below dir.
func within(p, dir string) bool {
	return dir == "/" && p != "/" || strings.HasPrefix(p, dir+"/")
}

// changeScan turns changed inodes into candidate paths.
type changeScan struct {
	c      *comparison
	a, b   *side
	paths  []string
	cands  map[string]bool
	seen   map[string]bool // entries looked at
	listed map[string]bool // directories listed
}

// wanted reports whether p is one of the compared paths or lies below one.
func (s *changeScan) wanted(p string) bool {
	for _, q := range s.paths {
		if p == q || within(p, q) {
			return true
		}
	}
	return false
}

// relevant reports whether anything at or below p can be wanted.
func (s *changeScan) relevant(p string) bool {
	for _, q := range s.paths {
		if p == q || within(p, q) || within(q, p) {
			return true
		}
	}
	return false
}

// touch handles a changed inode at rel: the entry itself and, for a directory, every name it has on either side.
func (s *changeScan) touch(rel string, dir bool) error {
	if err := s.entry(rel); err != nil || !dir || s.listed[rel] || !s.relevant(rel) {
		return err
	}
	s.listed[rel] = true
	names := map[string]bool{}
	for _, l := range []*side{s.a, s.b} {
		ns, err := l.upper.names(rel)
		if err != nil {
			return err
		}
		for _, n := range ns {
			names[n] = true
		}
		if l.upper.opaque(rel) {
			if err := lowerTree(s.c.ctx, l, rel, s.cands); err != nil {
				return err
			}
		}
	}
	for n := range names {
		if err := s.entry(path.Join(rel, n)); err != nil {
			return err
		}
	}
	return nil
}

// entry makes rel a candidate if it is a non-directory on either side (with the image's files below it), and walks a directory that is not the same directory on the other side.
func (s *changeScan) entry(rel string) error {
	if s.seen[rel] || !s.relevant(rel) {
		return nil
	}
	s.seen[rel] = true
	if err := s.c.ctx.Err(); err != nil {
		return err
	}
	var st [2]*unix.Stat_t
	sides := [2]*side{s.a, s.b}
	for i, l := range sides {
		var err error
		if st[i], err = l.upper.lstat(rel); err != nil {
			return err
		}
	}
	if st[0] != nil || st[1] != nil {
		s.cands[rel] = true // even a directory: it hides an image file of the same name
	}
	for i, l := range sides {
		x, o := st[i], st[1-i]
		switch {
		case x == nil:
		case !isDir(x):
			// An image directory deleted or replaced here hides its files.
			if err := lowerTree(s.c.ctx, l, rel, s.cands); err != nil {
				return err
			}
		case o == nil || !isDir(o) || o.Ino != x.Ino:
			fd, err := l.upper.openDir(rel)
			if err != nil {
				return fmt.Errorf("open %s: %w", l.upper.at(rel), err)
			}
			if err := newView(s.c, l).walk(fd, rel, s.cands); err != nil {
				return err
			}
		}
	}
	return nil
}

// lazyView resolves paths with system calls, for the few paths compareChanges looks at.
type lazyView struct{ s *side }

func (v lazyView) resolve(rel string) (*entry, error) {
	up := v.s.upper
	st, err := up.lstat(rel)
	if err != nil {
		return nil, err
	}
	if st != nil {
		if isWhiteout(st) || isDir(st) {
			return nil, nil
		}
		return &entry{t: up, rel: rel, st: *st, upper: true}, nil
	}
	// Not in the upper layer: the image shows through unless an ancestor is deleted, not a directory, or opaque.
	for dir := path.Dir(rel); ; dir = path.Dir(dir) {
		st, err := up.lstat(dir)
		if err != nil {
			return nil, err
		}
		if up.hides(dir, st) {
			return nil, nil
		}
		if dir == "/" {
			break
		}
	}
	return lowerEntry(v.s, rel)
}
