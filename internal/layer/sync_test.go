package layer

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fiemapDelalloc reports whether file has data still only in the page cache (an extent flagged
// FIEMAP_EXTENT_DELALLOC: not yet allocated, not written), asking without syncing it first.
func fiemapDelalloc(t *testing.T, file string) bool {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const fsIocFiemap = 0xC020660B // _IOWR('f', 11, struct fiemap)
	const maxExtents = 64
	type extent struct {
		Logical, Physical, Length uint64
		_                         [2]uint64
		Flags                     uint32
		_                         [3]uint32
	}
	var req struct {
		Start, Length                        uint64
		Flags, MappedExtents, ExtentCount, _ uint32
		Extents                              [maxExtents]extent
	}
	req.Length = ^uint64(0)
	req.ExtentCount = maxExtents
	if err := ioctlPtr(int(f.Fd()), fsIocFiemap, unsafe.Pointer(&req)); err != nil {
		t.Fatalf("fiemap %s: %v", file, err)
	}
	if req.MappedExtents == 0 {
		t.Fatalf("fiemap %s: no extents", file)
	}
	for _, e := range req.Extents[:req.MappedExtents] {
		if e.Flags&0x4 != 0 { // FIEMAP_EXTENT_DELALLOC
			return true
		}
	}
	return false
}

// SyncTree writes out what is under its directory, and only that: a neighbour layer's buffered data on the same
// btrfs stays in the page cache (syncfs would have written it, and waited for it). Elsewhere it syncs the file
// system.
func TestSyncTreeWritesOnlyItsTree(t *testing.T) {
	d, _ := openBtrfs(t)
	mine, theirs := mustCreate(t, d, "mine"), mustCreate(t, d, "theirs")
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, p := range []string{filepath.Join(mine, "a"), filepath.Join(mine, "sub", "b"), filepath.Join(theirs, "c")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(mine, "link")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(mine, "whiteout"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if !fiemapDelalloc(t, filepath.Join(mine, "a")) || !fiemapDelalloc(t, filepath.Join(theirs, "c")) {
		t.Skip("written data is not delayed on this btrfs: nothing to tell apart")
	}
	if err := SyncTree(mine); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(mine, "a"), filepath.Join(mine, "sub", "b")} {
		if fiemapDelalloc(t, p) {
			t.Errorf("%s is still only in the page cache after SyncTree", p)
		}
	}
	if !fiemapDelalloc(t, filepath.Join(theirs, "c")) {
		t.Errorf("SyncTree of one layer wrote out another layer's data")
	}
	// Not btrfs: syncfs.
	plain := t.TempDir()
	if err := os.WriteFile(filepath.Join(plain, "x"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := SyncTree(plain); err != nil {
		t.Fatalf("SyncTree of a directory elsewhere: %v", err)
	}
	if err := SyncTree(filepath.Join(plain, "x")); err == nil {
		t.Fatal("SyncTree of a file succeeded")
	}
}
