package layer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// Disk quotas for btrfs layers: a btrfs qgroup per layer subvolume, driven through ioctls (no btrfs tool).
//
// Kernel ABI from include/uapi/linux/btrfs.h and btrfs_tree.h.
const (
	btrfsQuotaCtlEnable       = 1 // BTRFS_QUOTA_CTL_ENABLE: full qgroup accounting
	btrfsQuotaCtlDisable      = 2 // BTRFS_QUOTA_CTL_DISABLE
	btrfsQuotaCtlEnableSimple = 4 // BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA (kernel 6.7+)

	btrfsQgroupLimitMaxRfer = 1 << 0 // BTRFS_QGROUP_LIMIT_MAX_RFER
	btrfsQgroupLimitMaxExcl = 1 << 1 // BTRFS_QGROUP_LIMIT_MAX_EXCL

	btrfsQuotaTreeObjectID = 8   // BTRFS_QUOTA_TREE_OBJECTID
	btrfsQgroupStatusKey   = 240 // BTRFS_QGROUP_STATUS_KEY
	btrfsQgroupInfoKey     = 242 // BTRFS_QGROUP_INFO_KEY
	btrfsQgroupLimitKey    = 244 // BTRFS_QGROUP_LIMIT_KEY

	btrfsQgroupStatusFlagOn           = 1 << 0 // BTRFS_QGROUP_STATUS_FLAG_ON
	btrfsQgroupStatusFlagInconsistent = 1 << 2 // BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT
	btrfsQgroupStatusFlagSimpleMode   = 1 << 3 // BTRFS_QGROUP_STATUS_FLAG_SIMPLE_MODE

	btrfsQgroupLevelShift = 48 // a qgroup id is level<<48 | subvolume id
)

// btrfsQuotaCtlArgs is struct btrfs_ioctl_quota_ctl_args.
type btrfsQuotaCtlArgs struct {
	Cmd    uint64
	Status uint64
}

// btrfsQgroupLimit is struct btrfs_qgroup_limit.
type btrfsQgroupLimit struct {
	Flags   uint64
	MaxRfer uint64
	MaxExcl uint64
	RsvRfer uint64
	RsvExcl uint64
}

// btrfsQgroupLimitArgs is struct btrfs_ioctl_qgroup_limit_args.
type btrfsQgroupLimitArgs struct {
	QgroupID uint64
	Lim      btrfsQgroupLimit
}

// btrfsQgroupCreateArgs is struct btrfs_ioctl_qgroup_create_args.
type btrfsQgroupCreateArgs struct {
	Create   uint64
	QgroupID uint64
}

var (
	_ [16 - unsafe.Sizeof(btrfsQuotaCtlArgs{})]struct{}
	_ [unsafe.Sizeof(btrfsQuotaCtlArgs{}) - 16]struct{}
	_ [48 - unsafe.Sizeof(btrfsQgroupLimitArgs{})]struct{}
	_ [unsafe.Sizeof(btrfsQgroupLimitArgs{}) - 48]struct{}
)

var (
	btrfsIocQuotaCtl     = ioc(iocRead|iocWrite, btrfsIoctlMagic, 40, unsafe.Sizeof(btrfsQuotaCtlArgs{})) // BTRFS_IOC_QUOTA_CTL
	btrfsIocQgroupCreate = iow(btrfsIoctlMagic, 42, unsafe.Sizeof(btrfsQgroupCreateArgs{}))               // BTRFS_IOC_QGROUP_CREATE
	btrfsIocQgroupLimit  = ioc(iocRead, btrfsIoctlMagic, 43, unsafe.Sizeof(btrfsQgroupLimitArgs{}))       // BTRFS_IOC_QGROUP_LIMIT
)

// QuotaMode is how a btrfs file system accounts qgroups.
type QuotaMode string

const (
	QuotaOff    QuotaMode = "off"    // no qgroups: nothing is enforced
	QuotaFull   QuotaMode = "full"   // full qgroup accounting (shared extents tracked by backref walks)
	QuotaSimple QuotaMode = "simple" // simple quotas: an extent is charged to the subvolume that wrote it
)

// btrfsQuotaCtl runs a BTRFS_IOC_QUOTA_CTL command on the file system of fd.
func btrfsQuotaCtl(fd int, cmd uint64) error {
	args := btrfsQuotaCtlArgs{Cmd: cmd}
	return ioctlPtr(fd, btrfsIocQuotaCtl, unsafe.Pointer(&args))
}

// btrfsQgroupSetLimit sets the limits of qgroup id (0: the subvolume open at fd).
func btrfsQgroupSetLimit(fd int, id uint64, lim btrfsQgroupLimit) error {
	args := btrfsQgroupLimitArgs{QgroupID: id, Lim: lim}
	return ioctlPtr(fd, btrfsIocQgroupLimit, unsafe.Pointer(&args))
}

// btrfsQgroupDestroy removes qgroup id. A qgroup that does not exist is not an error.
func btrfsQgroupDestroy(fd int, id uint64) error {
	args := btrfsQgroupCreateArgs{Create: 0, QgroupID: id}
	err := ioctlPtr(fd, btrfsIocQgroupCreate, unsafe.Pointer(&args))
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// quotaTreeSearch calls fn for every item of the quota tree of the file system of fd with a key type in
// [minType, maxType], in key order.
func quotaTreeSearch(fd int, minType, maxType uint32, fn func(objectid uint64, typ uint32, offset uint64, data []byte)) error {
	err := searchTree(fd, btrfsSearchKey{
		TreeID:      btrfsQuotaTreeObjectID,
		MaxObjectID: math.MaxUint64, MaxOffset: math.MaxUint64, MaxTransid: math.MaxUint64,
		MinType: minType, MaxType: maxType,
	}, func(obj uint64, typ uint32, off uint64, data []byte) bool {
		if typ >= minType && typ <= maxType {
			fn(obj, typ, off, data)
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("quota %w", err)
	}
	return nil
}

// quotaMode reports how the file system of fd accounts qgroups. A file system without a quota tree is QuotaOff.
func quotaMode(fd int) (QuotaMode, bool, error) {
	var flags uint64
	found := false
	err := quotaTreeSearch(fd, btrfsQgroupStatusKey, btrfsQgroupStatusKey, func(_ uint64, _ uint32, _ uint64, data []byte) {
		// struct btrfs_qgroup_status_item: version, generation, flags, rescan (, enable_gen).
		if len(data) >= 24 {
			flags = binary.LittleEndian.Uint64(data[16:])
			found = true
		}
	})
	if errors.Is(err, unix.ENOENT) || !found {
		return QuotaOff, false, nil
	}
	if err != nil {
		return QuotaOff, false, err
	}
	inconsistent := flags&btrfsQgroupStatusFlagInconsistent != 0
	switch {
	case flags&btrfsQgroupStatusFlagOn == 0:
		return QuotaOff, false, nil
	case flags&btrfsQgroupStatusFlagSimpleMode != 0:
		return QuotaSimple, inconsistent, nil
	default:
		return QuotaFull, inconsistent, nil
	}
}

// qgroupUsage is what one qgroup holds and may hold.
type qgroupUsage struct {
	ID               uint64
	Rfer, Excl       uint64
	MaxRfer, MaxExcl uint64 // 0: no limit
}

// listQgroups returns the level-0 qgroups (one per subvolume) of the file system of fd, keyed by id.
func listQgroups(fd int) (map[uint64]*qgroupUsage, error) {
	out := map[uint64]*qgroupUsage{}
	get := func(id uint64) *qgroupUsage {
		q := out[id]
		if q == nil {
			q = &qgroupUsage{ID: id}
			out[id] = q
		}
		return q
	}
	err := quotaTreeSearch(fd, btrfsQgroupInfoKey, btrfsQgroupLimitKey, func(obj uint64, typ uint32, off uint64, data []byte) {
		// Info and limit items have objectid 0 and the qgroup id as offset.
		if obj != 0 || off>>btrfsQgroupLevelShift != 0 {
			return
		}
		switch typ {
		case btrfsQgroupInfoKey:
			// struct btrfs_qgroup_info_item: generation, rfer, rfer_cmpr, excl, excl_cmpr.
			if len(data) >= 40 {
				q := get(off)
				q.Rfer = binary.LittleEndian.Uint64(data[8:])
				q.Excl = binary.LittleEndian.Uint64(data[24:])
			}
		case btrfsQgroupLimitKey:
			// struct btrfs_qgroup_limit_item: flags, max_rfer, max_excl, rsv_rfer, rsv_excl.
			if len(data) >= 24 {
				q := get(off)
				flags := binary.LittleEndian.Uint64(data[0:])
				if flags&btrfsQgroupLimitMaxRfer != 0 {
					q.MaxRfer = binary.LittleEndian.Uint64(data[8:])
				}
				if flags&btrfsQgroupLimitMaxExcl != 0 {
					q.MaxExcl = binary.LittleEndian.Uint64(data[16:])
				}
			}
		}
	})
	if errors.Is(err, unix.ENOENT) {
		return out, nil
	}
	return out, err
}

// subvolID returns the id of the subvolume open at fd (its level-0 qgroup id).
func subvolID(fd int) (uint64, error) {
	info, err := subvolInfo(fd)
	if err != nil {
		return 0, err
	}
	return info.TreeID, nil
}

var btrfsIocSync = ioc(0, btrfsIoctlMagic, 8, 0) // BTRFS_IOC_SYNC: commit, and wake the cleaner that drops deleted subvolumes

const (
	btrfsRootTreeObjectID = 1   // BTRFS_ROOT_TREE_OBJECTID
	btrfsRootItemKey      = 132 // BTRFS_ROOT_ITEM_KEY
)

// Limiter is implemented by drivers that cap how much disk space a layer may use. LimiterOf says whether a
// driver enforces limits.
type Limiter interface {
	// SetLimit caps layer id at bytes (0: no limit). Writes past the cap fail with EDQUOT.
	SetLimit(id string, bytes int64) error
	// DiskUsage is what layer id counts against its limit now, and the limit (0: none).
	DiskUsage(id string) (used, limit int64, err error)
}

// LimiterOf returns d's Limiter if d enforces per-layer limits: the btrfs driver with quotas on. The copy
// driver enforces nothing.
func LimiterOf(d Driver) (Limiter, bool) {
	b, ok := d.(*btrfsDriver)
	if !ok || b.quota == QuotaOff {
		return nil, false
	}
	return b, true
}

// QuotaModeOf reports how d accounts per-layer disk use (QuotaOff for the copy driver).
func QuotaModeOf(d Driver) QuotaMode {
	if b, ok := d.(*btrfsDriver); ok {
		return b.quota
	}
	return QuotaOff
}

// enableQuota turns qgroups on for the file system of the layer root, once: a file system that already has
// quotas keeps the mode it has (switching would drop every limit). want is QuotaFull or QuotaSimple. It then
// removes qgroups left behind by subvolumes that no longer exist (older kernels do not do that themselves).
func (d *btrfsDriver) enableQuota(want QuotaMode) error {
	mode, _, err := quotaMode(d.rootFd)
	if err != nil {
		return err
	}
	if mode == QuotaOff {
		cmd := uint64(btrfsQuotaCtlEnable)
		if want == QuotaSimple {
			cmd = btrfsQuotaCtlEnableSimple
		}
		if err := btrfsQuotaCtl(d.rootFd, cmd); err != nil {
			return fmt.Errorf("enable %s quotas: %w", want, err)
		}
		if mode, _, err = quotaMode(d.rootFd); err != nil {
			return err
		}
		if mode == QuotaOff {
			return fmt.Errorf("enable %s quotas: still off after BTRFS_IOC_QUOTA_CTL", want)
		}
		d.log.Info("enabled btrfs quotas on the layer file system", "mode", mode, "root", d.root)
	} else if mode != want {
		d.log.Info("keeping the layer file system's quota mode", "mode", mode, "wanted", want)
	}
	d.quota = mode
	if mode == QuotaFull {
		d.keepQgroupsConsistent()
	}
	d.removeStaleQgroups()
	return nil
}

// removeStaleQgroups destroys level-0 qgroups whose subvolume is gone (not even waiting to be dropped).
func (d *btrfsDriver) removeStaleQgroups() {
	qs, err := listQgroups(d.rootFd)
	if err != nil {
		d.log.Warn("list qgroups", "err", err)
		return
	}
	for id := range qs {
		if id < btrfsFirstFreeObjID {
			continue // the top-level subvolume (5) and other trees
		}
		if ok, err := subvolExists(d.rootFd, id); err != nil || ok {
			continue
		}
		if err := btrfsQgroupDestroy(d.rootFd, id); err != nil {
			d.log.Warn("remove stale qgroup", "qgroup", id, "err", err)
		}
	}
}

// subvolExists reports whether subvolume id has a root item (it exists, or was deleted and is not dropped yet).
func subvolExists(fd int, id uint64) (bool, error) {
	args := new(btrfsSearchArgsV2)
	args.Key = btrfsSearchKey{
		TreeID: btrfsRootTreeObjectID, MinObjectID: id, MaxObjectID: id,
		MinType: btrfsRootItemKey, MaxType: btrfsRootItemKey,
		MaxOffset: math.MaxUint64, MaxTransid: math.MaxUint64, NrItems: 1,
	}
	args.BufSize = uint64(len(args.Buf))
	if err := ioctlPtr(fd, btrfsIocTreeSearchV2, unsafe.Pointer(args)); err != nil {
		return false, err
	}
	return args.Key.NrItems > 0, nil
}

// openLayer opens layer id's directory.
func (d *btrfsDriver) openLayer(id string) (int, error) {
	if err := ValidateID(id); err != nil {
		return -1, err
	}
	fd, err := unix.Openat(d.rootFd, id, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open layer %s: %w", id, err)
	}
	return fd, nil
}

// SetLimit implements Limiter: it sets the referenced-bytes limit of the layer's qgroup. Referenced, not
// exclusive: a layer's referenced count is everything it holds, shared with a fork parent or not, and changes
// only when the layer itself is written; its exclusive count changes when a sibling or parent drops its copy
// of shared data, so an exclusive limit would let one sandbox push another over its limit.
func (d *btrfsDriver) SetLimit(id string, bytes int64) error {
	if d.quota == QuotaOff {
		return errdefs.New(errdefs.ErrConflict, "disk quotas are off on the layer file system")
	}
	if bytes < 0 {
		return errdefs.New(errdefs.ErrInvalid, "negative disk limit")
	}
	fd, err := d.openLayer(id)
	if err != nil {
		return fmt.Errorf("set disk limit: %w", err)
	}
	defer unix.Close(fd)
	lim := btrfsQgroupLimit{Flags: btrfsQgroupLimitMaxRfer, MaxRfer: uint64(bytes)}
	if bytes == 0 {
		lim.MaxRfer = math.MaxUint64 // the kernel's "clear this limit"
	}
	if err := btrfsQgroupSetLimit(fd, 0, lim); err != nil {
		return fmt.Errorf("set disk limit of layer %s: %w", id, err)
	}
	return nil
}

// DiskUsage implements Limiter.
func (d *btrfsDriver) DiskUsage(id string) (used, limit int64, err error) {
	fd, err := d.openLayer(id)
	if err != nil {
		return 0, 0, err
	}
	sid, err := subvolID(fd)
	unix.Close(fd)
	if err != nil {
		return 0, 0, fmt.Errorf("disk usage of layer %s: %w", id, err)
	}
	qs, err := listQgroups(d.rootFd)
	if err != nil {
		return 0, 0, fmt.Errorf("disk usage of layer %s: %w", id, err)
	}
	q := qs[sid]
	if q == nil {
		return 0, 0, fmt.Errorf("disk usage of layer %s: no qgroup 0/%d", id, sid)
	}
	return int64(q.Rfer), int64(q.MaxRfer), nil
}

// qgroupOf is the qgroup id of layer id (its subvolume id), or 0 when quotas are off or it has none.
func (d *btrfsDriver) qgroupOf(id string) uint64 {
	if d.quota == QuotaOff {
		return 0
	}
	fd, err := d.openLayer(id)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Ino != btrfsFirstFreeObjID {
		return 0
	}
	sid, err := subvolID(fd)
	if err != nil {
		return 0
	}
	return sid
}

// removeQgroup removes the qgroup of a subvolume just deleted. The kernel drops a deleted subvolume's extents
// later, in its cleaner thread, and refuses (EBUSY) to remove a qgroup that still counts any; recent kernels
// (measured: 6.18) then remove the qgroup themselves once the subvolume is dropped, and on older ones
// removeStaleQgroups sweeps it at the next start. So EBUSY here is the normal case, not an error.
func (d *btrfsDriver) removeQgroup(qgroup uint64) {
	if qgroup == 0 {
		return
	}
	if err := btrfsQgroupDestroy(d.rootFd, qgroup); err != nil && !errors.Is(err, unix.EBUSY) {
		d.log.Warn("remove layer qgroup", "qgroup", qgroup, "err", err)
	}
}

// btrfsQuotaRescanArgs mirrors struct btrfs_ioctl_quota_rescan_args.
type btrfsQuotaRescanArgs struct {
	Flags    uint64
	Progress uint64
	Reserved [6]uint64
}

var (
	btrfsIocQuotaRescan = iow(btrfsIoctlMagic, 44, unsafe.Sizeof(btrfsQuotaRescanArgs{})) // BTRFS_IOC_QUOTA_RESCAN
	btrfsIocRescanWait  = ioc(0, btrfsIoctlMagic, 46, 0)                                  // BTRFS_IOC_QUOTA_RESCAN_WAIT
)

// keepQgroupsConsistent waits for the rescan that enabling quotas starts (and starts one if the qgroups are
// inconsistent at open): until it ends every count is incomplete. The kernel's default drop_subtree_threshold (3)
// is left as it is: with it, deleting a subvolume whose tree is three levels deep or more marks the qgroups
// inconsistent rather than walking it, which changes only exclusive counts (the limits here are on referenced
// bytes, which another layer's deletion does not change). Raising it to account every deletion made a fork right
// after deletions 30-60% slower on the 2-core build machine (the cleaner competes for the CPUs).
func (d *btrfsDriver) keepQgroupsConsistent() {
	if _, inconsistent, err := quotaMode(d.rootFd); err == nil && inconsistent {
		// Enabling quotas starts a rescan of its own (EINPROGRESS here); either way, wait for it: until it ends
		// the limits are checked against incomplete numbers.
		var args btrfsQuotaRescanArgs
		if err := ioctlPtr(d.rootFd, btrfsIocQuotaRescan, unsafe.Pointer(&args)); err != nil && !errors.Is(err, unix.EINPROGRESS) {
			d.log.Warn("rescan inconsistent qgroups", "err", err)
			return
		}
		start := time.Now()
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(d.rootFd), btrfsIocRescanWait, 0); errno != 0 {
			d.log.Warn("wait for the qgroup rescan", "err", errno)
			return
		}
		d.log.Info("qgroups rescanned", "root", d.root, "ms", time.Since(start).Milliseconds())
	}
}
