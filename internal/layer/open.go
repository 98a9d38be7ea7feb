package layer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// DefaultImageSize is the apparent size of the sparse btrfs image Open creates when Options.ImageSize is 0.
// Only blocks actually written take space on the host.
const DefaultImageSize int64 = 64 << 30

// MinImageSize is the smallest Options.ImageSize Open accepts (mkfs.btrfs needs roughly 114 MiB).
const MinImageSize int64 = 256 << 20

const (
	imageName = "layers.img" // the loop image inside dir
	mountName = "layers"     // where the image is mounted (loop btrfs) or where copy layers live
)

// Options configures Open.
type Options struct {
	// Driver selects the driver: "btrfs", "copy", or "" to choose automatically (btrfs if at all possible,
	// else copy).
	Driver string
	// ImageSize is the apparent size of the sparse loop image created when dir is not on btrfs.
	// 0 means DefaultImageSize. It only matters when the image is first created.
	ImageSize int64
	// Quota is how per-layer disk limits are accounted on btrfs: "" or QuotaFull (full qgroups, the default),
	// QuotaSimple (simple quotas, kernel 6.7+), or QuotaOff (no limits). Quotas are enabled on the layer file
	// system once, when Open finds them off; a file system with quotas already on keeps its mode. If they
	// cannot be enabled, Open logs why and continues without limits (LimiterOf then reports none).
	Quota QuotaMode
	// Logger receives notices about the choices Open makes; nil means slog.Default().
	Logger *slog.Logger
}

// These are variables so that tests can simulate hosts without loop devices or mkfs.btrfs.
var (
	loopControlPath = "/dev/loop-control"
	mkfsBtrfs       = "mkfs.btrfs"
)

// Open prepares dir to hold layers and returns the driver that manages them.
//
// With Driver "" or "btrfs":
//   - if dir is on btrfs, layers are subvolumes directly in dir;
//   - otherwise layers are subvolumes in a btrfs file system on the sparse image dir/layers.img, attached to a
//     loop device (with autoclear) and mounted at dir/layers. An image that is already mounted there (a server
//     restart) is reused; an existing image that is not mounted (a reboot) is attached and mounted again,
//     never reformatted. A new image is created and formatted with mkfs.btrfs on first use.
//
// With Driver "", if no btrfs can be had (no loop devices, no mkfs.btrfs, mount refused...), Open logs why and
// falls back to the copy driver, whose layers are plain directories in dir/layers. The choice is sticky: once
// dir/layers holds copy layers, Open keeps using the copy driver, and once dir/layers.img exists, failing to
// mount it is an error rather than a silent switch that would hide the layers inside it.
//
// Driver "copy" always uses the copy driver in dir/layers.
//
// The driver's Close never unmounts the loop file system: sandboxes may keep using their layers across a
// server restart. To take it down, unmount dir/layers (the loop device then detaches itself).
func Open(ctx context.Context, dir string, opts Options) (Driver, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "layer")
	size := opts.ImageSize
	if size == 0 {
		size = DefaultImageSize
	}
	if size < MinImageSize {
		return nil, fmt.Errorf("open layers: %w", errdefs.New(errdefs.ErrInvalid,
			fmt.Sprintf("layer image size %d is below the minimum of %d bytes", size, MinImageSize)))
	}
	switch opts.Quota {
	case "", QuotaFull, QuotaSimple, QuotaOff:
	default:
		return nil, fmt.Errorf("open layers: %w", errdefs.New(errdefs.ErrInvalid,
			fmt.Sprintf("unknown quota mode %q (want \"full\", \"simple\" or \"off\")", opts.Quota)))
	}
	switch opts.Driver {
	case "", "btrfs", "copy":
	default:
		return nil, fmt.Errorf("open layers: %w", errdefs.New(errdefs.ErrInvalid,
			fmt.Sprintf("unknown layer driver %q (want \"btrfs\" or \"copy\")", opts.Driver)))
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open layers: %w", err)
	}
	dir = abs
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open layers: %w", err)
	}
	root := filepath.Join(dir, mountName)

	if opts.Driver == "copy" {
		log.Info("using copy layer driver", "root", root)
		return newCopyDriver(root, log)
	}

	if native, err := isBtrfs(dir); err != nil {
		return nil, fmt.Errorf("open layers: %w", err)
	} else if native {
		log.Info("using btrfs layer driver on the data directory's own btrfs", "root", dir)
		return newBtrfsWithQuota(dir, log, opts.Quota)
	}

	// Already mounted: a server restart.
	if ok, _ := isBtrfs(root); ok {
		log.Info("using btrfs layer driver on the already mounted image", "root", root, "source", mountSource(root))
		return newBtrfsWithQuota(root, log, opts.Quota)
	}

	img := filepath.Join(dir, imageName)
	if _, err := os.Lstat(img); err == nil {
		dev, err := attachAndMount(img, root)
		if err != nil {
			return nil, fmt.Errorf("open layers: mount existing image %s: %w", img, err)
		}
		log.Info("using btrfs layer driver on the remounted image", "root", root, "image", img, "device", dev)
		return newBtrfsWithQuota(root, log, opts.Quota)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("open layers: %w", err)
	}

	if hasEntries(root) {
		if opts.Driver == "btrfs" {
			return nil, fmt.Errorf("open layers: %w", errdefs.New(errdefs.ErrConflict,
				root+" holds layers of the copy driver; mounting a btrfs image over them would hide them"))
		}
		log.Info("using copy layer driver: the layer directory already holds copy layers", "root", root)
		return newCopyDriver(root, log)
	}

	dev, err := createImage(ctx, img, root, size)
	if err != nil {
		if opts.Driver == "btrfs" {
			return nil, fmt.Errorf("open layers: %w", err)
		}
		log.Warn("btrfs is not available, falling back to the copy layer driver (clones will copy data)",
			"reason", err.Error(), "root", root)
		return newCopyDriver(root, log)
	}
	log.Info("using btrfs layer driver on a new image", "root", root, "image", img, "size", size, "device", dev)
	return newBtrfsWithQuota(root, log, opts.Quota)
}

// newBtrfsWithQuota makes a btrfs driver on root and enables quota mode on its file system; failing to enable
// quotas only leaves layers without limits (logged).
func newBtrfsWithQuota(root string, log *slog.Logger, mode QuotaMode) (Driver, error) {
	d, err := newBtrfsDriver(root, log)
	if err != nil {
		return nil, err
	}
	if mode == "" {
		mode = QuotaFull
	}
	if mode != QuotaOff {
		if err := d.enableQuota(mode); err != nil {
			d.log.Warn("btrfs quotas unavailable: per-sandbox disk limits are not enforced", "err", err)
			d.quota = QuotaOff
		}
	}
	return d, nil
}

// hasEntries reports whether dir exists and is not empty.
func hasEntries(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	names, _ := f.Readdirnames(1)
	return len(names) > 0
}

// createImage makes the sparse image img, formats it with btrfs and mounts it at mnt. On failure it leaves
// nothing behind.
func createImage(ctx context.Context, img, mnt string, size int64) (dev string, err error) {
	// Fail early, before writing anything, if loop devices cannot be had.
	if _, err := os.Stat(loopControlPath); err != nil {
		return "", fmt.Errorf("no loop devices: %w", err)
	}
	mkfs, err := lookSbin(mkfsBtrfs)
	if err != nil {
		return "", fmt.Errorf("mkfs.btrfs not found: %w", err)
	}
	tmp := img + ".tmp"
	_ = os.Remove(tmp) // a leftover from an interrupted attempt
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("create image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("create image: %w", err)
	}
	out, err := exec.CommandContext(ctx, mkfs, "-q", "-L", "ramify-layers", tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("mkfs.btrfs: %w: %s", err, bytes.TrimSpace(out))
	}
	// Only a fully formatted image ever carries the final name: an existing layers.img is always mountable data.
	if err := os.Rename(tmp, img); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("create image: %w", err)
	}
	dev, err = attachAndMount(img, mnt)
	if err != nil {
		// The image is new and holds nothing: remove it so the next Open tries afresh instead of insisting on it.
		os.Remove(img)
		return "", err
	}
	return dev, nil
}

// lookSbin finds name in PATH or in the sbin directories, which are often missing from PATH.
func lookSbin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if filepath.IsAbs(name) {
		return "", os.ErrNotExist
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

// attachAndMount mounts the btrfs image img at mnt through a loop device (reusing one the image is already
// attached to) and returns the device.
func attachAndMount(img, mnt string) (string, error) {
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return "", err
	}
	dev := findLoop(img)
	var loopFd = -1
	if dev == "" {
		var err error
		dev, loopFd, err = attachLoop(img)
		if err != nil {
			return "", err
		}
	}
	// With autoclear, closing our descriptor detaches the device unless the mount holds it.
	defer func() {
		if loopFd >= 0 {
			unix.Close(loopFd)
		}
	}()
	if err := unix.Mount(dev, mnt, "btrfs", unix.MS_NOATIME, ""); err != nil {
		return "", fmt.Errorf("mount %s on %s: %w", dev, mnt, err)
	}
	return dev, nil
}

// findLoop returns the loop device img is attached to, or "".
func findLoop(img string) string {
	var st unix.Stat_t
	if err := unix.Stat(img, &st); err != nil {
		return ""
	}
	matches, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil || strings.TrimSpace(string(b)) != img {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(m)))
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(fd)
		unix.Close(fd)
		if err == nil && info.Inode == st.Ino && info.Device == uint64(st.Dev) {
			return dev
		}
	}
	return ""
}

// attachLoop attaches img to a free loop device with autoclear and returns the device and an open descriptor
// of it, which the caller closes once the device is mounted.
func attachLoop(img string) (string, int, error) {
	imgFd, err := unix.Open(img, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("open image: %w", err)
	}
	defer unix.Close(imgFd) // the loop device holds its own reference
	ctl, err := unix.Open(loopControlPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("open %s: %w", loopControlPath, err)
	}
	defer unix.Close(ctl)

	var lastErr error
	for attempt := 0; attempt < 16; attempt++ {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", -1, fmt.Errorf("get free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			// No devtmpfs (some containers): make the node ourselves. Loop devices are block major 7.
			if merr := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); merr == nil || errors.Is(merr, unix.EEXIST) {
				fd, err = unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
			}
		}
		if err != nil {
			return "", -1, fmt.Errorf("open %s: %w", dev, err)
		}
		err = configureLoop(fd, imgFd, img)
		if err == nil {
			return dev, fd, nil
		}
		unix.Close(fd)
		lastErr = fmt.Errorf("attach %s to %s: %w", img, dev, err)
		if !errors.Is(err, unix.EBUSY) {
			return "", -1, lastErr
		}
		// EBUSY: someone else took the device between GET_FREE and now; try another.
	}
	return "", -1, lastErr
}

// configureLoop binds the loop device fd to the file imgFd with autoclear, preferring direct I/O (no double
// caching in the host page cache) and LOOP_CONFIGURE, falling back to what older kernels support.
func configureLoop(fd, imgFd int, img string) error {
	var info unix.LoopInfo64
	copy(info.File_name[:len(info.File_name)-1], img)
	var err error
	for _, flags := range []uint32{unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO, unix.LO_FLAGS_AUTOCLEAR} {
		info.Flags = flags
		cfg := unix.LoopConfig{Fd: uint32(imgFd), Info: info}
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if err == nil || errors.Is(err, unix.EBUSY) {
			return err
		}
		if !errors.Is(err, unix.EINVAL) {
			break
		}
	}
	if !errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.EINVAL) {
		return err
	}
	// Kernels before 5.8 have no LOOP_CONFIGURE.
	if err := unix.IoctlSetInt(fd, unix.LOOP_SET_FD, imgFd); err != nil {
		return err
	}
	info.Flags = unix.LO_FLAGS_AUTOCLEAR
	if err := unix.IoctlLoopSetStatus64(fd, &info); err != nil {
		_ = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
		return err
	}
	return nil
}

// mountSource returns the source device of the mount at mnt according to /proc/self/mountinfo, or "".
func mountSource(mnt string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	src := ""
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 10 || unescapeMount(fields[4]) != mnt {
			continue
		}
		for i := 6; i < len(fields)-2; i++ {
			if fields[i] == "-" {
				src = unescapeMount(fields[i+2]) // the last mount on mnt wins
				break
			}
		}
	}
	return src
}

// unescapeMount undoes the octal escapes (\040 etc.) of /proc/self/mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
