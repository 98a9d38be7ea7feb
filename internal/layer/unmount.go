package layer

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ImageMounted reports whether Open's loop-mounted btrfs image is mounted at dir/layers (dir as given to Open).
// A server takes it before Open to know whether Open mounted it, and so whether undoing its start-up must
// unmount it.
func ImageMounted(dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	return mountSource(filepath.Join(abs, mountName)) != ""
}

// UnmountImage undoes the mount of the loop image that Open made at dir/layers: it unmounts it, and the loop
// device, attached with autoclear, detaches itself. For a start-up that fails after Open, before any sandbox
// uses the layers; a mount that was there before Open must be left alone (sandboxes survive server restarts).
func UnmountImage(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	mnt := filepath.Join(abs, mountName)
	if mountSource(mnt) == "" {
		return nil
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		return fmt.Errorf("unmount %s: %w", mnt, err)
	}
	return nil
}
