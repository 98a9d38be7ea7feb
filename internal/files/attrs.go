package files

import (
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// SetAttr changes the permission bits (mode, when not nil: its permission, setuid, setgid and sticky bits) and
// the access and modification times (mtime, when not nil: both get it) of the file at p, as chmod and touch -d
// would. Symlinks are followed inside the root; /proc, /sys and /dev are refused. The file is reached through an
// O_PATH descriptor of the resolved file (its /proc/self/fd link), so nothing outside the root can be changed.
func (f *FS) SetAttr(p string, mode *os.FileMode, mtime *time.Time) error {
	p, err := CleanPath(p)
	if err != nil {
		return err
	}
	if err := refuseProtected("set attributes of", p); err != nil {
		return err
	}
	root, err := f.acquire()
	if err != nil {
		return err
	}
	defer f.release()
	fd, err := resolve(root, p, unix.O_PATH)
	if err != nil {
		return wrap("set attributes of", p, err)
	}
	defer unix.Close(fd)
	link := "/proc/self/fd/" + strconv.Itoa(fd)
	if mode != nil {
		if err := unix.Fchmodat(unix.AT_FDCWD, link, unixMode(*mode)&0o7777, 0); err != nil {
			return wrap("chmod", p, err)
		}
	}
	if mtime != nil {
		ts := unix.NsecToTimespec(mtime.UnixNano())
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, link, []unix.Timespec{ts, ts}, 0); err != nil {
			return wrap("set times of", p, err)
		}
	}
	return nil
}
