package layer

// Lineage and change lists of btrfs layers: what lets a diff of two layers look only at what changed since their
// common history instead of walking both trees.
//
// Every btrfs item carries the id of the transaction (generation) that last changed it, and a snapshot shares its
// source's items as they were at the snapshot's creation. So if layers a and b share history up to generation g,
// every inode whose item is not newer than g in both layers is the same inode with the same content in both; only
// inodes newer than g (and the entries of directories newer than g) can differ. The kernel's tree search skips
// whole subtrees of the b-tree older than g, so listing those inodes costs in proportion to what changed.
//
// A subvolume records its direct source (parent UUID) and creation generation itself; the rest of its lineage
// (sources of sources, which fork deletes as soon as the children exist) is recorded by Clone in an extended
// attribute of the new layer's root directory, outside the overlay's upper directory.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	lineageXattr = "trusted.ramify.lineage" // sequence of (UUID, generation) ancestors beyond the direct source
	maxLineage   = 64                       // ancestors kept; older ones are dropped (a diff then walks)

	btrfsInodeItemKey  = 1  // BTRFS_INODE_ITEM_KEY
	btrfsInodeRefKey   = 12 // BTRFS_INODE_REF_KEY
	btrfsInodeExtrefKy = 13 // BTRFS_INODE_EXTREF_KEY
)

// btrfsSubvolInfoArgs is struct btrfs_ioctl_get_subvol_info_args (504 bytes).
type btrfsSubvolInfoArgs struct {
	TreeID       uint64
	Name         [btrfsVolNameMax + 1]byte
	ParentID     uint64
	DirID        uint64
	Generation   uint64
	Flags        uint64
	UUID         [16]byte
	ParentUUID   [16]byte
	ReceivedUUID [16]byte
	Ctransid     uint64
	Otransid     uint64
	Stransid     uint64
	Rtransid     uint64
	Times        [4]struct {
		Sec  uint64
		Nsec uint32
		_    uint32
	}
	Reserved [8]uint64
}

// btrfsSearchKey is struct btrfs_ioctl_search_key (104 bytes).
type btrfsSearchKey struct {
	TreeID, MinObjectID, MaxObjectID, MinOffset, MaxOffset, MinTransid, MaxTransid uint64
	MinType, MaxType, NrItems                                                      uint32
	_                                                                              uint32
	_                                                                              [4]uint64
}

// btrfsSearchArgsV2 is struct btrfs_ioctl_search_args_v2 followed by its result buffer.
type btrfsSearchArgsV2 struct {
	Key     btrfsSearchKey
	BufSize uint64
	Buf     [64 << 10]byte
}

// btrfsInoLookupArgs is struct btrfs_ioctl_ino_lookup_args.
type btrfsInoLookupArgs struct {
	TreeID   uint64
	ObjectID uint64
	Name     [4080]byte
}

var (
	_ [504 - unsafe.Sizeof(btrfsSubvolInfoArgs{})]struct{}
	_ [unsafe.Sizeof(btrfsSubvolInfoArgs{}) - 504]struct{}
	_ [104 - unsafe.Sizeof(btrfsSearchKey{})]struct{}
	_ [unsafe.Sizeof(btrfsSearchKey{}) - 104]struct{}
	_ [4096 - unsafe.Sizeof(btrfsInoLookupArgs{})]struct{}
	_ [unsafe.Sizeof(btrfsInoLookupArgs{}) - 4096]struct{}
)

var (
	btrfsIocGetSubvolInfo = ioc(iocRead, btrfsIoctlMagic, 60, unsafe.Sizeof(btrfsSubvolInfoArgs{}))         // BTRFS_IOC_GET_SUBVOL_INFO
	btrfsIocTreeSearchV2  = ioc(iocRead|iocWrite, btrfsIoctlMagic, 17, unsafe.Sizeof(btrfsSearchKey{})+8)   // BTRFS_IOC_TREE_SEARCH_V2
	btrfsIocInoLookup     = ioc(iocRead|iocWrite, btrfsIoctlMagic, 18, unsafe.Sizeof(btrfsInoLookupArgs{})) // BTRFS_IOC_INO_LOOKUP
	btrfsIocStartSync     = ioc(iocRead, btrfsIoctlMagic, 24, 8)                                            // BTRFS_IOC_START_SYNC
	btrfsIocWaitSync      = ioc(iocWrite, btrfsIoctlMagic, 22, 8)                                           // BTRFS_IOC_WAIT_SYNC
)

// ancestor is a subvolume in a layer's lineage and the generation up to which the layer's history is its.
type ancestor struct {
	uuid [16]byte
	gen  uint64
}

const ancestorSize = 24

func subvolInfo(fd int) (*btrfsSubvolInfoArgs, error) {
	var info btrfsSubvolInfoArgs
	if err := ioctlPtr(fd, btrfsIocGetSubvolInfo, unsafe.Pointer(&info)); err != nil {
		return nil, fmt.Errorf("get subvolume info: %w", err)
	}
	return &info, nil
}

// recordedLineage is what the layer open at fd recorded beyond its direct source.
func recordedLineage(fd int) []ancestor {
	buf := make([]byte, maxLineage*ancestorSize)
	n, err := unix.Fgetxattr(fd, lineageXattr, buf)
	if err != nil {
		return nil
	}
	var out []ancestor
	for b := buf[:n-n%ancestorSize]; len(b) > 0; b = b[ancestorSize:] {
		var a ancestor
		copy(a.uuid[:], b)
		a.gen = binary.LittleEndian.Uint64(b[16:])
		out = append(out, a)
	}
	return out
}

// recordLineage writes into the new snapshot dst the lineage of its source src beyond src itself: src's own source
// and everything src recorded.
func recordLineage(srcFd, dstFd int) error {
	info, err := subvolInfo(srcFd)
	if err != nil {
		return err
	}
	if info.ParentUUID == ([16]byte{}) {
		return nil // src was created, not cloned: the snapshot's own parent UUID says it all
	}
	chain := append([]ancestor{{info.ParentUUID, info.Otransid}}, recordedLineage(srcFd)...)
	if len(chain) > maxLineage {
		chain = chain[:maxLineage]
	}
	buf := make([]byte, 0, len(chain)*ancestorSize)
	for _, a := range chain {
		buf = append(buf, a.uuid[:]...)
		buf = binary.LittleEndian.AppendUint64(buf, a.gen)
	}
	if err := unix.Fsetxattr(dstFd, lineageXattr, buf, 0); err != nil {
		return fmt.Errorf("record lineage: %w", err)
	}
	return nil
}

// lineage is the layer open at fd, then its sources, nearest first.
func lineage(fd int) ([]ancestor, error) {
	info, err := subvolInfo(fd)
	if err != nil {
		return nil, err
	}
	chain := []ancestor{{info.UUID, math.MaxUint64}}
	if info.ParentUUID != ([16]byte{}) {
		chain = append(chain, ancestor{info.ParentUUID, info.Otransid})
		chain = append(chain, recordedLineage(fd)...)
	}
	return chain, nil
}

// openSubvol opens dir, which must be the root of a btrfs subvolume.
func openSubvol(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	var sfs unix.Statfs_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if sfs.Type != unix.BTRFS_SUPER_MAGIC || st.Ino != btrfsFirstFreeObjID {
		unix.Close(fd)
		return -1, errNotSubvol
	}
	return fd, nil
}

var errNotSubvol = errors.New("not a btrfs subvolume")

// CommonGeneration returns the generation up to which the btrfs layers at directories a and b share their
// history (math.MaxUint64 when a and b are the same layer). ok is false when they share none that the layers
// record: not btrfs, created separately, or related only through more than maxLineage clones.
func CommonGeneration(a, b string) (gen uint64, ok bool, err error) {
	var chains [2][]ancestor
	for i, dir := range []string{a, b} {
		fd, err := openSubvol(dir)
		if err != nil {
			if errors.Is(err, errNotSubvol) {
				return 0, false, nil
			}
			return 0, false, fmt.Errorf("lineage of %s: %w", dir, err)
		}
		chains[i], err = lineage(fd)
		unix.Close(fd)
		if err != nil {
			return 0, false, fmt.Errorf("lineage of %s: %w", dir, err)
		}
	}
	// The first ancestor of a that is also one of b's is their nearest common one; each left it at its own
	// generation, and only history up to the earlier of the two is shared.
	for _, x := range chains[0] {
		for _, y := range chains[1] {
			if x.uuid == y.uuid {
				return min(x.gen, y.gen), true, nil
			}
		}
	}
	return 0, false, nil
}

// Change is an inode of a layer changed after some generation, at one of its paths (relative to the layer's
// directory; "" for the directory itself).
type Change struct {
	Path string
	Ino  uint64
	Dir  bool
}

// ChangedSince lists the inodes of the btrfs layer at dir changed after generation gen, by every path they
// have. ok is false, and nothing is listed, when more than limit inodes changed (a walk is then as cheap).
func ChangedSince(dir string, gen uint64, limit int) (changes []Change, ok bool, err error) {
	fd, err := openSubvol(dir)
	if err != nil {
		return nil, false, fmt.Errorf("changes of %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if gen == math.MaxUint64 {
		return nil, true, nil
	}
	// Buffered writes reach the b-tree (the inode's new transid, its extents) only at writeback, and other inode
	// updates when their transaction commits: flush the file system's dirty data and commit first. This waits
	// for whatever the layers' file system has pending, as the kernel would within seconds anyway.
	if err := unix.Syncfs(fd); err != nil {
		return nil, false, fmt.Errorf("changes of %s: sync: %w", dir, err)
	}
	type inode struct {
		dir   bool
		links uint32
	}
	changed := map[uint64]*inode{}
	refs := map[uint64][]inodeRef{}
	err = treeSearch(fd, btrfsFirstFreeObjID, math.MaxUint64, gen+1, func(objectid uint64, typ uint32, offset uint64, data []byte) bool {
		switch typ {
		case btrfsInodeItemKey:
			if len(data) >= 56 && binary.LittleEndian.Uint64(data[8:]) > gen {
				changed[objectid] = &inode{
					dir:   binary.LittleEndian.Uint32(data[52:])&unix.S_IFMT == unix.S_IFDIR,
					links: binary.LittleEndian.Uint32(data[40:]),
				}
			}
		case btrfsInodeRefKey, btrfsInodeExtrefKy:
			refs[objectid] = append(refs[objectid], parseRefs(typ, offset, data)...)
		}
		return len(changed) <= limit
	})
	if err != nil {
		return nil, false, fmt.Errorf("changes of %s: %w", dir, err)
	}
	if len(changed) > limit {
		return nil, false, nil
	}
	dirs := map[uint64]string{btrfsFirstFreeObjID: ""}
	for ino, in := range changed {
		if ino == btrfsFirstFreeObjID {
			changes = append(changes, Change{Path: "", Ino: ino, Dir: true})
			continue
		}
		// A changed inode's item usually shares a leaf with its reference, which the search then returned; look
		// the names up when they straddle two leaves or the file has several links.
		r := refs[ino]
		if len(r) == 0 || in.links > 1 {
			if r, err = lookupRefs(fd, ino); err != nil {
				return nil, false, fmt.Errorf("changes of %s: %w", dir, err)
			}
		}
		for _, ref := range r {
			parent, ok := dirs[ref.parent]
			if !ok {
				if parent, err = dirPath(fd, ref.parent); err != nil {
					return nil, false, fmt.Errorf("changes of %s: %w", dir, err)
				}
				dirs[ref.parent] = parent
			}
			changes = append(changes, Change{Path: parent + ref.name, Ino: ino, Dir: in.dir})
		}
	}
	return changes, true, nil
}

// inodeRef is one name of an inode in a directory.
type inodeRef struct {
	parent uint64
	name   string
}

// parseRefs decodes an INODE_REF item (key offset: the directory; data: index, name length, name, repeated) or
// an INODE_EXTREF item (data: directory, index, name length, name, repeated).
func parseRefs(typ uint32, offset uint64, data []byte) []inodeRef {
	var out []inodeRef
	for len(data) > 0 {
		parent := offset
		if typ == btrfsInodeExtrefKy {
			if len(data) < 18 {
				break
			}
			parent, data = binary.LittleEndian.Uint64(data), data[8:]
		}
		if len(data) < 10 {
			break
		}
		n := int(binary.LittleEndian.Uint16(data[8:]))
		if len(data) < 10+n {
			break
		}
		out = append(out, inodeRef{parent, string(data[10 : 10+n])})
		data = data[10+n:]
	}
	return out
}

// lookupRefs returns every name of inode ino.
func lookupRefs(fd int, ino uint64) ([]inodeRef, error) {
	var out []inodeRef
	err := treeSearch(fd, ino, ino, 0, func(_ uint64, typ uint32, offset uint64, data []byte) bool {
		if typ == btrfsInodeRefKey || typ == btrfsInodeExtrefKy {
			out = append(out, parseRefs(typ, offset, data)...)
		}
		return true
	})
	return out, err
}

// dirPath is the path of directory ino relative to the subvolume's root, with a trailing slash.
func dirPath(fd int, ino uint64) (string, error) {
	if ino == btrfsFirstFreeObjID {
		return "", nil
	}
	args := btrfsInoLookupArgs{ObjectID: ino}
	if err := ioctlPtr(fd, btrfsIocInoLookup, unsafe.Pointer(&args)); err != nil {
		return "", fmt.Errorf("look up directory %d: %w", ino, err)
	}
	name, _, _ := bytes.Cut(args.Name[:], []byte{0})
	return string(name), nil
}

// treeSearch calls fn for every item of the subvolume open at fd with objectid in [minObj, maxObj] that lies in
// a b-tree block newer than minTransid - 1, in key order, until fn returns false.
func treeSearch(fd int, minObj, maxObj, minTransid uint64, fn func(objectid uint64, typ uint32, offset uint64, data []byte) bool) error {
	return searchTree(fd, btrfsSearchKey{
		MinObjectID: minObj, MaxObjectID: maxObj,
		MaxOffset: math.MaxUint64, MinTransid: minTransid, MaxTransid: math.MaxUint64,
		MaxType: math.MaxUint8,
	}, fn)
}

// searchTree runs BTRFS_IOC_TREE_SEARCH_V2 over the key range k (its tree, objectids, types, offsets and
// transids), page by page, and calls fn for every item returned, in key order, until fn returns false.
func searchTree(fd int, k btrfsSearchKey, fn func(objectid uint64, typ uint32, offset uint64, data []byte) bool) error {
	args := new(btrfsSearchArgsV2)
	maxObj := k.MaxObjectID
	for {
		args.Key = k
		args.Key.NrItems = math.MaxUint32
		args.BufSize = uint64(len(args.Buf))
		if err := ioctlPtr(fd, btrfsIocTreeSearchV2, unsafe.Pointer(args)); err != nil {
			return fmt.Errorf("tree search: %w", err)
		}
		n := args.Key.NrItems
		if n == 0 {
			return nil
		}
		b := args.Buf[:]
		var obj, off uint64
		var typ uint32
		for i := uint32(0); i < n; i++ {
			if len(b) < 32 {
				return fmt.Errorf("tree search: short result")
			}
			obj = binary.LittleEndian.Uint64(b[8:])
			off = binary.LittleEndian.Uint64(b[16:])
			typ = binary.LittleEndian.Uint32(b[24:])
			l := int(binary.LittleEndian.Uint32(b[28:]))
			if len(b) < 32+l {
				return fmt.Errorf("tree search: short item")
			}
			if !fn(obj, typ, off, b[32:32+l]) {
				return nil
			}
			b = b[32+l:]
		}
		// The search key is (objectid, type, offset) ordered lexicographically: resume after the last one.
		switch {
		case off < math.MaxUint64:
			k.MinObjectID, k.MinType, k.MinOffset = obj, typ, off+1
		case typ < math.MaxUint8:
			k.MinObjectID, k.MinType, k.MinOffset = obj, typ+1, 0
		case obj < maxObj:
			k.MinObjectID, k.MinType, k.MinOffset = obj+1, 0, 0
		default:
			return nil
		}
	}
}
