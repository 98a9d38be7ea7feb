package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The sandbox's root file system is built in two steps. stageRoot, which needs nothing of the sandbox, mounts
// its /proc, /sys and /dev in the agent's fresh mount namespace under a staging directory: a spare agent does it
// before it is claimed. finishRoot, given the root mount, attaches it, moves the staged mounts into it (each with
// what is mounted under it) and pivots into it: an overlay of the image (lower) and the sandbox's writable layer
// (upper), with its own /proc (of the family's PID namespace), a minimal /dev and /dev/pts, and nothing of the
// host.
const (
	stagingDir = "/mnt"
	stagedRoot = stagingDir + "/root"
)

// stagedMounts are the mounts stageRoot makes under stagingDir, which finishRoot moves to the same names in
// the root.
var stagedMounts = []string{"proc", "sys", "dev"}

func must(err error, what string) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// stageRoot mounts the sandbox's /proc, /sys and /dev under stagingDir.
func stageRoot() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if err := unix.Mount("tmpfs", stagingDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mount staging tmpfs: %w", err)
	}
	for _, d := range append([]string{"root"}, stagedMounts...) {
		if err := os.Mkdir(filepath.Join(stagingDir, d), 0o755); err != nil {
			return err
		}
	}
	// hidepid=invisible: a process sees in /proc only the processes it could ptrace: those of its own sandbox
	// (same uid and group, see SandboxGID), not a fork sibling's, nor ramify's own (not dumpable).
	if err := must(unix.Mount("proc", filepath.Join(stagingDir, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "hidepid=invisible"), "mount /proc"); err != nil {
		return err
	}
	// sysfs of the sandbox's own network namespace, read-only. The kernel lets a user namespace mount sysfs only
	// where a sysfs is already fully visible in its mount namespace (mount_too_revealing): the family init
	// mounts one for that in its own root, which this mount namespace copies and pivot_root leaves behind.
	if err := must(unix.Mount("sysfs", filepath.Join(stagingDir, "sys"), "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""), "mount /sys"); err != nil {
		return err
	}
	if err := maskKernelPaths(stagingDir); err != nil {
		return err
	}
	dev := filepath.Join(stagingDir, "dev")
	if err := must(unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"), "mount /dev"); err != nil {
		return err
	}
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		target := filepath.Join(dev, n)
		f, err := os.Create(target)
		if err != nil {
			return err
		}
		f.Close()
		if err := must(unix.Mount(filepath.Join("/dev", n), target, "", unix.MS_BIND, ""), "bind /dev/"+n); err != nil {
			return err
		}
	}
	os.Mkdir(filepath.Join(dev, "pts"), 0o755)
	if err := must(unix.Mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"), "mount /dev/pts"); err != nil {
		return err
	}
	os.Symlink("pts/ptmx", filepath.Join(dev, "ptmx"))
	os.Mkdir(filepath.Join(dev, "shm"), 0o1777)
	if err := must(unix.Mount("shm", filepath.Join(dev, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"), "mount /dev/shm"); err != nil {
		return err
	}
	os.Symlink("/proc/self/fd", filepath.Join(dev, "fd"))
	os.Symlink("/proc/self/fd/0", filepath.Join(dev, "stdin"))
	os.Symlink("/proc/self/fd/1", filepath.Join(dev, "stdout"))
	os.Symlink("/proc/self/fd/2", filepath.Join(dev, "stderr"))
	return nil
}

// finishRoot attaches the root mount (descriptor fdRootMount), moves the staged mounts into it, writes the
// sandbox's host name and pivots into the root.
func finishRoot(cfg Config) error {
	root := stagedRoot
	if err := unix.MoveMount(fdRootMount, "", unix.AT_FDCWD, root, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach root file system: %w", err)
	}
	unix.Close(fdRootMount)
	for _, d := range []string{"proc", "sys", "dev", "tmp", "root", "run"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	for _, d := range stagedMounts {
		// A moved mount takes what is mounted under it along (the masks under /proc, /dev's device nodes).
		if err := must(unix.MoveMount(unix.AT_FDCWD, filepath.Join(stagingDir, d), unix.AT_FDCWD, filepath.Join(root, d), 0), "move /"+d+" into the root"); err != nil {
			return err
		}
	}
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)

	if cfg.Hostname != "" {
		if err := setHostname(cfg.Hostname); err != nil {
			return err
		}
		hosts := fmt.Sprintf("127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n", cfg.Hostname)
		os.WriteFile(filepath.Join(root, "etc/hosts"), []byte(hosts), 0o644)
		os.WriteFile(filepath.Join(root, "etc/hostname"), []byte(cfg.Hostname+"\n"), 0o644)
	}

	if err := os.Chdir(root); err != nil {
		return err
	}
	if err := must(unix.PivotRoot(".", "."), "pivot_root"); err != nil {
		return err
	}
	if err := must(unix.Unmount(".", unix.MNT_DETACH), "detach old root"); err != nil {
		return err
	}
	return os.Chdir("/")
}

// maskedPaths are hidden from the sandbox as the default specs of runc and Docker hide them: a file under /dev/null, a directory
// under an empty read-only tmpfs. They expose the host's kernel (its memory image, keys of every user, timers
// and scheduler state of every task, which leak addresses and what runs next door), hardware (ACPI, sound, SCSI,
// firmware tables) or, for powercap, the RAPL energy counters that make a power side channel.
//
// Beyond runc's list: the host's block devices and the file systems' statistics. /sys/fs/btrfs lists the quota
// group of every sandbox's layer (on every ramify server of the host), with its bytes as they change: any
// sandbox could watch the others' disk activity live, or use it as a covert channel; a loop device's
// backing_file names the host's data directory; a disk's stat counters are the host's I/O. Each block device
// directory is masked where it is (see blockDeviceDirs), not only the /sys/block index that links to it.
var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
	"/sys/devices/virtual/powercap",
	"/sys/fs/btrfs", "/sys/fs/ext4", "/sys/fs/xfs", "/sys/fs/f2fs", "/sys/fs/erofs", "/sys/block", "/sys/class/block", "/sys/dev/block",
	"/sys/devices/virtual/block",
}

// blockDeviceDirs returns the directories under root's /sys/devices that hold block devices other than the
// virtual ones (masked as a whole above): the "block" directory of each disk's controller, e.g.
// /sys/devices/pci0000:00/0000:00:05.0/virtio2/block, found through the /sys/class/block links.
func blockDeviceDirs(root string) []string {
	links, _ := os.ReadDir(filepath.Join(root, "sys/class/block"))
	seen := map[string]bool{}
	var dirs []string
	for _, l := range links {
		target, err := os.Readlink(filepath.Join(root, "sys/class/block", l.Name()))
		if err != nil {
			continue
		}
		// ../../devices/<path>/block/<disk>[/<partition>]: the directory up to and including "block".
		rel, ok := strings.CutPrefix(filepath.Clean(filepath.Join("/sys/class/block", target)), "/sys/devices/")
		if !ok || strings.HasPrefix(rel, "virtual/") {
			continue
		}
		i := strings.Index(rel+"/", "/block/")
		if i < 0 {
			continue
		}
		d := "/sys/devices/" + rel[:i] + "/block"
		if !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// readonlyPaths are made read-only, as runc's default spec does: kernel tunables (/proc/sys: most are host-wide,
// and the namespaced ones are ramify's to set), the magic SysRq trigger (crash or reboot the host), and the
// bus, file system and interrupt settings of the host.
var readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}

// maskKernelPaths applies maskedPaths and readonlyPaths under root (before pivot_root). Paths this kernel does not
// have are skipped. Sandbox code cannot undo them: it holds no CAP_SYS_ADMIN outside the interpreter, and the
// seccomp profile refuses mount, umount and the mount API to every sandbox process.
func maskKernelPaths(root string) error {
	// The block devices' own directories first: the /sys/class/block links that find them are masked next.
	for _, p := range append(blockDeviceDirs(root), maskedPaths...) {
		target := filepath.Join(root, p)
		st, err := os.Lstat(target)
		if err != nil {
			continue // not on this kernel
		}
		if st.IsDir() {
			err = unix.Mount("tmpfs", target, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0555")
		} else {
			err = unix.Mount("/dev/null", target, "", unix.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range readonlyPaths {
		target := filepath.Join(root, p)
		if _, err := os.Lstat(target); err != nil {
			continue
		}
		if err := unix.Mount(target, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", p, err)
		}
		// A bind remount changes only the flags it is given: keep /proc's nosuid, nodev and noexec.
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
		if err := unix.Mount("", target, "", flags, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	return nil
}

func setHostname(name string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	return nil
}
