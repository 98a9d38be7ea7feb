package image

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown)")
	}
}

func owner(t *testing.T, p string) (uint32, uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid, st.Mode
}

func TestShiftOwnership(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "host-file")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(outside, []byte("host"), 0o644))
	must(os.Chown(outside, 0, 0))

	must(os.MkdirAll(filepath.Join(root, "etc/sub"), 0o755))
	must(os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644))
	must(os.WriteFile(filepath.Join(root, "etc/sub/user"), nil, 0o600))
	must(os.Chown(filepath.Join(root, "etc/sub/user"), 1000, 50))
	must(os.WriteFile(filepath.Join(root, "suid"), []byte("#!/bin/sh\n"), 0o755))
	must(unix.Chmod(filepath.Join(root, "suid"), 0o4755))
	must(os.WriteFile(filepath.Join(root, "sgid"), nil, 0o755))
	must(os.Chown(filepath.Join(root, "sgid"), 0, 42))
	must(unix.Chmod(filepath.Join(root, "sgid"), 0o2755))
	must(os.Mkdir(filepath.Join(root, "sgiddir"), 0o755))
	must(unix.Chmod(filepath.Join(root, "sgiddir"), 0o2775))
	must(os.Symlink(outside, filepath.Join(root, "escape")))        // absolute, points outside the tree
	must(os.Symlink("../../..", filepath.Join(root, "etc/sub/up"))) // relative, climbs out
	must(os.Symlink("nowhere", filepath.Join(root, "dangling")))
	must(os.WriteFile(filepath.Join(root, "hard1"), []byte("x"), 0o644))
	must(os.Chown(filepath.Join(root, "hard1"), 5, 5))
	must(os.Link(filepath.Join(root, "hard1"), filepath.Join(root, "etc/hard2")))
	must(unix.Mkfifo(filepath.Join(root, "fifo"), 0o644))
	must(os.Lchown(filepath.Join(root, "dangling"), 7, 8))

	// A version 2 file capability (cap_net_raw, effective), as setcap writes it on the host.
	capPath := filepath.Join(root, "ping")
	must(os.WriteFile(capPath, nil, 0o755))
	v2 := make([]byte, xattrCapsSz2)
	binary.LittleEndian.PutUint32(v2, vfsCapRevision2|1)
	binary.LittleEndian.PutUint32(v2[4:], 1<<unix.CAP_NET_RAW)
	haveCaps := unix.Setxattr(capPath, capXattr, v2, 0) == nil

	if err := ShiftOwnership(root, 100000, 200000); err != nil {
		t.Fatal(err)
	}

	checks := []struct {
		path     string
		uid, gid uint32
	}{
		{"", 100000, 200000},
		{"etc", 100000, 200000},
		{"etc/sub", 100000, 200000},
		{"etc/passwd", 100000, 200000},
		{"etc/sub/user", 101000, 200050},
		{"suid", 100000, 200000},
		{"sgid", 100000, 200042},
		{"sgiddir", 100000, 200000},
		{"escape", 100000, 200000},
		{"etc/sub/up", 100000, 200000},
		{"dangling", 100007, 200008},
		{"hard1", 100005, 200005}, // shifted once, not twice
		{"etc/hard2", 100005, 200005},
		{"fifo", 100000, 200000},
	}
	for _, c := range checks {
		uid, gid, _ := owner(t, filepath.Join(root, c.path))
		if uid != c.uid || gid != c.gid {
			t.Errorf("/%s owned by %d:%d, want %d:%d", c.path, uid, gid, c.uid, c.gid)
		}
	}
	if uid, gid, _ := owner(t, outside); uid != 0 || gid != 0 {
		t.Errorf("symlink target outside the tree was changed to %d:%d", uid, gid)
	}
	for _, c := range []struct {
		path string
		mode uint32
	}{{"suid", 0o4755}, {"sgid", 0o2755}, {"sgiddir", 0o2775}, {"etc/sub/user", 0o600}} {
		if _, _, mode := owner(t, filepath.Join(root, c.path)); mode&0o7777 != c.mode {
			t.Errorf("/%s mode %o, want %o", c.path, mode&0o7777, c.mode)
		}
	}
	if haveCaps {
		got := getCaps(capPath)
		if len(got) != xattrCapsSz3 {
			t.Fatalf("capability attribute after the shift: %x, want a version 3 attribute", got)
		}
		if m := binary.LittleEndian.Uint32(got); m != vfsCapRevision3|1 {
			t.Errorf("capability magic %#x", m)
		}
		if p := binary.LittleEndian.Uint32(got[4:]); p != 1<<unix.CAP_NET_RAW {
			t.Errorf("permitted capabilities %#x", p)
		}
		if r := binary.LittleEndian.Uint32(got[xattrCapsSz2:]); r != 100000 {
			t.Errorf("capability root id %d, want 100000", r)
		}
	} else {
		t.Log("file system does not take security.capability; capability part not tested")
	}

	// A second run would push ids out of the mapped range; it is refused.
	err := ShiftOwnership(root, 100000, 100000)
	if err == nil || !strings.Contains(err.Error(), "already shifted") {
		t.Errorf("second shift: %v, want an 'already shifted' error", err)
	}
}

func TestShiftOwnershipMissingRoot(t *testing.T) {
	err := ShiftOwnership(filepath.Join(t.TempDir(), "nope"), 1, 1)
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("got %v, want ErrNotExist", err)
	}
	if err := ShiftOwnership(t.TempDir(), -1, 0); err == nil {
		t.Error("negative offset accepted")
	}
}

func TestShiftCaps(t *testing.T) {
	v3 := make([]byte, xattrCapsSz3)
	binary.LittleEndian.PutUint32(v3, vfsCapRevision3)
	binary.LittleEndian.PutUint32(v3[xattrCapsSz2:], 5)
	if r := binary.LittleEndian.Uint32(shiftCaps(v3, 100000)[xattrCapsSz2:]); r != 100005 {
		t.Errorf("v3 root id %d", r)
	}
	odd := []byte{1, 2, 3}
	if got := shiftCaps(odd, 1); string(got) != string(odd) {
		t.Errorf("unknown format changed: %x", got)
	}
}
