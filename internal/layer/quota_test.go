package layer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fillUntilFull writes 1 MiB chunks to path until a write fails or max bytes are written, and returns what
// was written and the error that stopped it (nil if max was reached). The data is flushed with fsync, since
// btrfs may report EDQUOT only at writeback.
func fillUntilFull(t *testing.T, path string, max int64) (int64, error) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i*31 + 7)
	}
	var n int64
	for n < max {
		buf[0]++
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			return n, err
		}
	}
	return n, f.Sync()
}

func isQuotaErr(err error) bool { return errors.Is(err, unix.EDQUOT) || errors.Is(err, unix.ENOSPC) }

// testLimits is the conformance check of Limiter: a driver that claims to enforce limits stops a layer at its
// limit, only that layer, lets it write again once files are deleted, and does not pass the limit to clones
// (the caller sets each layer's own). A driver without a Limiter must say so.
func testLimits(t *testing.T, d Driver) {
	lim, ok := LimiterOf(d)
	if !ok {
		if d.Name() == "btrfs" && QuotaModeOf(d) != QuotaOff {
			t.Fatalf("btrfs driver with quota mode %s has no Limiter", QuotaModeOf(d))
		}
		t.Skipf("the %s driver does not enforce disk limits", d.Name())
	}
	ctx := context.Background()
	const limit = 48 << 20
	a := mustCreate(t, d, "a")
	free := mustCreate(t, d, "free")
	if err := lim.SetLimit("a", limit); err != nil {
		t.Fatalf("SetLimit: %v", err)
	}
	if _, got, err := lim.DiskUsage("a"); err != nil || got != limit {
		t.Fatalf("DiskUsage limit = %d, %v; want %d", got, err, limit)
	}
	n, err := fillUntilFull(t, filepath.Join(a, "big"), 2*limit)
	if !isQuotaErr(err) {
		t.Fatalf("wrote %d bytes into a layer limited to %d: err %v, want EDQUOT or ENOSPC", n, limit, err)
	}
	if n > limit {
		t.Fatalf("wrote %d bytes into a layer limited to %d", n, limit)
	}
	// Another layer is not affected.
	if n, err := fillUntilFull(t, filepath.Join(free, "big"), limit+(8<<20)); err != nil {
		t.Fatalf("unlimited layer: wrote %d, then %v", n, err)
	}
	// Deleting files frees the quota: the layer can be written again.
	must(t, os.Remove(filepath.Join(a, "big")))
	unix.Sync()
	if n, err := fillUntilFull(t, filepath.Join(a, "again"), 8<<20); err != nil {
		t.Fatalf("after deleting: wrote %d, then %v", n, err)
	}
	// A clone gets a limit of its own, independent of its source's.
	mustClone(t, d, "a", "b")
	_, got, err := lim.DiskUsage("b")
	t.Logf("clone's limit before SetLimit: %d, %v", got, err)
	must(t, lim.SetLimit("b", 2*limit))
	if _, got, err := lim.DiskUsage("b"); err != nil || got != 2*limit {
		t.Fatalf("clone's limit = %d, %v; want %d", got, err, 2*limit)
	}
	if _, got, err := lim.DiskUsage("a"); err != nil || got != limit {
		t.Fatalf("source's limit = %d, %v after setting its clone's; want %d", got, err, limit)
	}
	for _, id := range []string{"a", "b", "free"} {
		must(t, d.Remove(ctx, id))
	}
	if _, _, err := lim.DiskUsage("a"); err == nil {
		t.Fatal("DiskUsage of a removed layer succeeded")
	}
}

// qgroupsGone waits until no qgroup of a subvolume in ids is left: the kernel drops deleted subvolumes in its
// cleaner thread, woken by BTRFS_IOC_SYNC, and their qgroups with them.
func qgroupsGone(t *testing.T, d *btrfsDriver, ids map[uint64]bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := ioctlPtr(d.rootFd, btrfsIocSync, nil); err != nil {
			t.Fatalf("BTRFS_IOC_SYNC: %v", err)
		}
		d.removeStaleQgroups()
		qs, err := listQgroups(d.rootFd)
		if err != nil {
			t.Fatal(err)
		}
		var left []uint64
		for id := range ids {
			if qs[id] != nil {
				left = append(left, id)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("qgroups %v of removed layers are still there", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBtrfsQuota checks both quota modes: enabled once at Open, limits enforced per layer, and no qgroup left
// behind by removed layers, clones and the fork's staging snapshots included.
func TestBtrfsQuota(t *testing.T) {
	for _, mode := range []QuotaMode{QuotaFull, QuotaSimple} {
		t.Run(string(mode), func(t *testing.T) {
			d, dir := openBtrfsQuota(t, mode)
			if got := QuotaModeOf(d); got != mode {
				t.Fatalf("quota mode %s, want %s", got, mode)
			}
			testLimits(t, d)
			bd := d.(*btrfsDriver)
			ids := map[uint64]bool{}
			ctx := context.Background()
			for i := 0; i < 3; i++ {
				id := fmt.Sprintf("l%d", i)
				p := mustCreate(t, d, id)
				for j := 0; j < 16; j++ {
					if _, err := fillUntilFull(t, filepath.Join(p, fmt.Sprint(j)), 1<<20); err != nil {
						t.Fatal(err)
					}
				}
				c := mustClone(t, d, id, id+"c")
				// The clone rewrites half of what it shares: accounting must follow shared extents.
				for j := 0; j < 8; j++ {
					if _, err := fillUntilFull(t, filepath.Join(c, fmt.Sprint(j)), 1<<20); err != nil {
						t.Fatal(err)
					}
				}
				for _, x := range []string{id, id + "c"} {
					ids[bd.qgroupOf(x)] = true
				}
			}
			for i := 0; i < 3; i++ {
				must(t, d.Remove(ctx, fmt.Sprintf("l%d", i)))
				must(t, d.Remove(ctx, fmt.Sprintf("l%dc", i)))
			}
			delete(ids, 0)
			if len(ids) != 6 {
				t.Fatalf("qgroup ids %v, want 6", ids)
			}
			start := time.Now()
			qgroupsGone(t, bd, ids)
			t.Logf("removed layers dropped with their qgroups in %v", time.Since(start))
			// The mode survives clones and removals. (A removal may leave the qgroups flagged inconsistent: the
			// kernel does not walk a deleted subvolume three or more tree levels deep; only exclusive counts are
			// affected, and limits are on referenced bytes: see keepQgroupsConsistent.)
			if m, _, err := quotaMode(bd.rootFd); err != nil || m != mode {
				t.Fatalf("quota status after removals: mode %s err %v", m, err)
			}

			// A second Open of the same (still mounted) file system keeps the mode and enables nothing twice.
			must(t, d.Close())
			d2, err := Open(ctx, dir, Options{Driver: "btrfs", Logger: testLogger(t), Quota: QuotaOff})
			if err != nil {
				t.Fatal(err)
			}
			defer d2.Close()
			if got := QuotaModeOf(d2); got != QuotaOff {
				t.Fatalf("Open with quotas off: mode %s", got)
			}
			d3, err := Open(ctx, dir, Options{Driver: "btrfs", Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer d3.Close()
			if got := QuotaModeOf(d3); got != mode {
				t.Fatalf("reopened with the default: mode %s, want the file system's %s", got, mode)
			}
		})
	}
}
