package security

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
	"golang.org/x/sys/unix"
)

// Sparse files against the disk quota: a file's apparent size is not what the quota counts, so a sandbox can
// make a 2 GiB (or 100 GiB) file that allocates nothing. Pause, resume and fork of a paused sandbox must keep it
// that way: the snapshot on the host holds its data only, and a restored layer is written under the quota.

// sparseSize is the apparent size of the sandboxes' sparse files: 32 times their quota.
const sparseSize = 2 << 30

// sparseStat returns the apparent size and the allocated bytes of path inside sandbox id.
func sparseStat(t *testing.T, s *testserver.Server, id, path string) (size, alloc int64) {
	t.Helper()
	res := diskSh(t, s, id, "stat -c '%s %b %B' "+path)
	f := strings.Fields(res.Stdout)
	if res.ExitCode != 0 || len(f) != 3 {
		t.Fatalf("stat %s: exit %d %q", path, res.ExitCode, res.Stdout)
	}
	size, _ = strconv.ParseInt(f[0], 10, 64)
	blocks, _ := strconv.ParseInt(f[1], 10, 64)
	unit, _ := strconv.ParseInt(f[2], 10, 64)
	return size, blocks * unit
}

// sparseMake makes /root/sparse in sandbox id: sparseSize apparent bytes, a marker written in the middle.
func sparseMake(t *testing.T, s *testserver.Server, id string) {
	t.Helper()
	diskWantWrite(t, "sparse file", diskSh(t, s, id, fmt.Sprintf(
		"truncate -s %d /root/sparse && printf marker | dd of=/root/sparse bs=1 seek=%d conv=notrunc,fsync 2>&1", sparseSize, sparseSize/2)))
}

// sparseCheck checks that /root/sparse of sandbox id is as sparseMake left it: its size, its marker, next to
// nothing allocated.
func sparseCheck(t *testing.T, s *testserver.Server, id string) {
	t.Helper()
	size, alloc := sparseStat(t, s, id, "/root/sparse")
	if size != sparseSize || alloc > 1<<20 {
		t.Errorf("restored /root/sparse: %d bytes, %d allocated; want %d bytes, next to nothing allocated", size, alloc, sparseSize)
	}
	res := diskSh(t, s, id, fmt.Sprintf("dd if=/root/sparse bs=1 skip=%d count=6 2>/dev/null", sparseSize/2))
	if res.Stdout != "marker" {
		t.Errorf("restored /root/sparse: %q at the middle, want the marker", res.Stdout)
	}
	diskSh(t, s, id, "sync") // the quota's counts are those of the last commit
	if u := diskGet(t, s, id).Usage; u == nil || u.DiskBytes == nil || *u.DiskBytes > diskQuota<<20 {
		t.Errorf("restored sandbox: usage %+v, want disk_bytes under the %d MiB quota", u, diskQuota)
	}
}

// sparseSnapshot returns the directory of sandbox id's snapshot in the server's local store.
func sparseSnapshot(t *testing.T, s *testserver.Server, id string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(s.DataDir, "snapshots", "objects", id, "*", "manifest.json"))
	if len(m) != 1 {
		t.Fatalf("snapshot of %s: manifests %v, want one", id, m)
	}
	return filepath.Dir(m[0])
}

func sparsePause(t *testing.T, s *testserver.Server, id string) *client.Sandbox {
	t.Helper()
	if _, _, err := s.Client.Pause(diskCtx(t), id); err != nil {
		t.Fatalf("pause: %v", err)
	}
	sb, err := s.Client.WaitStatus(diskCtx(t), id, "paused")
	if err != nil {
		t.Fatalf("wait paused: %v", err)
	}
	return sb
}

func sparseResume(t *testing.T, s *testserver.Server, id string) (*client.Sandbox, error) {
	t.Helper()
	if _, _, err := s.Client.Resume(diskCtx(t), id); err != nil {
		t.Fatalf("resume: %v", err)
	}
	return s.Client.WaitStatus(diskCtx(t), id, "running")
}

func TestSparseQuota(t *testing.T) {
	s := testserver.Start(t, "--disk-mib", fmt.Sprint(diskServerDefault))

	// Pause stores the data of a sparse file, not its holes; resume brings it back sparse and under the quota.
	t.Run("PauseResume", func(t *testing.T) {
		sb := diskCreate(t, s, client.CreateRequest{DiskMiB: diskQuota})
		sparseMake(t, s, sb.ID)
		paused := sparsePause(t, s, sb.ID)
		layer := filepath.Join(sparseSnapshot(t, s, sb.ID), "layer.tar")
		var st unix.Stat_t
		if err := unix.Stat(layer, &st); err != nil {
			t.Fatal(err)
		}
		t.Logf("pause of a %d byte sparse file: layer.tar %d bytes (%d allocated), snapshot_bytes %d, pause_ms %.0f",
			sparseSize, st.Size, st.Blocks*512, paused.Pause.SnapshotBytes, paused.Pause.PauseMs)
		if st.Blocks*512 > 8<<20 || st.Size > 8<<20 || paused.Pause.SnapshotBytes > 8<<20 {
			t.Errorf("the snapshot of a sandbox with a %d byte sparse file: layer.tar %d bytes, %d allocated on the host, snapshot_bytes %d; want a few KiB",
				sparseSize, st.Size, st.Blocks*512, paused.Pause.SnapshotBytes)
		}
		if _, err := sparseResume(t, s, sb.ID); err != nil {
			t.Fatalf("resume: %v", err)
		}
		sparseCheck(t, s, sb.ID)
		diskWantQuotaHit(t, "resumed sandbox", diskFill(t, s, sb.ID, "/root/big", 100))
	})

	// A fork of a paused sandbox restores its layer the same way, into each child.
	t.Run("ForkPaused", func(t *testing.T) {
		sb := diskCreate(t, s, client.CreateRequest{DiskMiB: diskQuota})
		sparseMake(t, s, sb.ID)
		sparsePause(t, s, sb.ID)
		var res struct {
			Children []string `json:"children"`
		}
		if err := s.PostJSON(diskCtx(t), "/v1/sandboxes/"+sb.ID+"/fork", map[string]any{"n": 1}, &res); err != nil || len(res.Children) != 1 {
			t.Fatalf("fork of the paused sandbox: %v %+v", err, res)
		}
		child := res.Children[0]
		t.Cleanup(func() { s.Client.Delete(context.Background(), child) }) //nolint:errcheck
		if _, err := s.Client.WaitStatus(diskCtx(t), child, "running"); err != nil {
			t.Fatalf("fork child: %v", err)
		}
		sparseCheck(t, s, child)
		diskWantQuotaHit(t, "fork child", diskFill(t, s, child, "/root/big", 100))
		if got := diskGet(t, s, sb.ID).Status; got != "paused" {
			t.Errorf("the forked sandbox is %s, want paused", got)
		}
	})

	// A sandbox paused at its quota, full of what the file system counts differently (small files kept inline in
	// its metadata, files of a few blocks, a file filling what is left), resumes: its restored layer is counted
	// about what the original was, and within the slack the restore is given.
	t.Run("FullLayerResumes", func(t *testing.T) {
		sb := diskCreate(t, s, client.CreateRequest{DiskMiB: diskQuota})
		diskWantWrite(t, "small files", diskSh(t, s, sb.ID, `mkdir -p /root/s && cd /root/s &&
			for i in $(seq 2000); do printf '%0100d' $i > i$i; printf '%03000d' $i > b$i; done &&
			mkdir -p deep/a/b/c && for i in $(seq 500); do echo $i > deep/a/b/c/f$i; ln -s f$i deep/a/b/c/l$i; done`))
		diskWantQuotaHit(t, "fill", diskSh(t, s, sb.ID, "dd if=/dev/urandom of=/root/fill bs=1M count=200 conv=fsync 2>&1"))
		diskSh(t, s, sb.ID, "sync")
		before := diskGet(t, s, sb.ID).Usage
		const list = `cd /root && (find s fill -type f | sort | xargs md5sum; find s -type l | sort | xargs readlink) | md5sum`
		sum := diskSh(t, s, sb.ID, list).Stdout
		sparsePause(t, s, sb.ID)
		if _, err := sparseResume(t, s, sb.ID); err != nil {
			t.Fatalf("resume of a sandbox paused at its quota: %v", err)
		}
		diskSh(t, s, sb.ID, "sync")
		after := diskGet(t, s, sb.ID).Usage
		if before == nil || before.DiskBytes == nil || after == nil || after.DiskBytes == nil {
			t.Fatalf("usage before %+v after %+v", before, after)
		}
		t.Logf("disk_bytes at the quota %d (%d MiB): paused with %d, resumed with %d (%+d)",
			int64(diskQuota)<<20, diskQuota, *before.DiskBytes, *after.DiskBytes, *after.DiskBytes-*before.DiskBytes)
		if got := diskSh(t, s, sb.ID, list).Stdout; got != sum {
			t.Errorf("resumed files differ: %q, want %q", got, sum)
		}
	})

	// Reflinked copies share their blocks, so the quota counts them once; written out they are whole files. A
	// pause of a layer whose data passes the quota fails, the sandbox keeps running with its files, and
	// nothing is left in the store: neither a snapshot N times the quota nor one that cannot be restored.
	t.Run("ReflinkCopies", func(t *testing.T) {
		sb := diskCreate(t, s, client.CreateRequest{DiskMiB: diskQuota})
		diskWantWrite(t, "reflinked copies", diskSh(t, s, sb.ID, `dd if=/dev/urandom of=/root/a bs=1M count=40 2>&1 &&
			for i in 1 2 3 4; do cp --reflink=always /root/a /root/c$i || exit 1; done; sync`))
		if _, _, err := s.Client.Pause(diskCtx(t), sb.ID); err != nil {
			t.Fatalf("pause: %v", err)
		}
		got, err := s.Client.WaitStatus(diskCtx(t), sb.ID, "paused")
		var pe *client.PauseError
		if !errors.As(err, &pe) || !strings.Contains(pe.Sandbox.Pause.Error, "disk quota") {
			var bytes int64
			if got != nil && got.Pause != nil {
				bytes = got.Pause.SnapshotBytes
			}
			t.Fatalf("pause of 200 MiB of reflinked copies under a %d MiB quota: %v (snapshot_bytes %d), want a failed pause naming the disk quota",
				diskQuota, err, bytes)
		}
		t.Logf("failed pause: %s", pe.Sandbox.Pause.Error)
		// What the failed pause wrote is deleted in the background, as it fails.
		for deadline := time.Now().Add(10 * time.Second); slices.Contains(s.Inventory().Snapshots, sb.ID); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("the failed pause left a snapshot in the store (10 s on)")
				break
			}
		}
		if res := diskSh(t, s, sb.ID, "cmp /root/a /root/c4 && echo same"); res.Stdout != "same\n" {
			t.Errorf("after the failed pause: %q", res.Stdout)
		}
	})

	// A snapshot whose files hold more than the quota (an older version wrote sparse files and reflinked copies
	// out in full) still resumes, with every file: its layer is restored under a cap its layer.tar bounds (the
	// shared layer file system is not filled whatever its disk_mib), and the sandbox then runs over its quota,
	// pause.warning saying so: its writes fail with EDQUOT until it frees space, then all is as usual.
	t.Run("OldSnapshotOverQuota", func(t *testing.T) {
		sb := diskCreate(t, s, client.CreateRequest{DiskMiB: diskQuota})
		diskWantWrite(t, "small file", diskSh(t, s, sb.ID, "echo kept > /root/kept && sync"))
		sparsePause(t, s, sb.ID)
		const big = 3 * diskQuota << 20
		sparseSwapLayer(t, sparseSnapshot(t, s, sb.ID), big)
		got, err := sparseResume(t, s, sb.ID)
		if err != nil {
			t.Fatalf("resume of an older version's snapshot holding three times its quota: %v, want it resumed with its files", err)
		}
		if got.Pause == nil || !strings.Contains(got.Pause.Warning, "EDQUOT") || !strings.Contains(got.Pause.Warning, fmt.Sprint(diskQuota)) {
			t.Errorf("resumed over its quota: pause %+v, want pause.warning saying writes fail until it frees space", got.Pause)
		} else {
			t.Logf("pause.warning: %s", got.Pause.Warning)
		}
		if res := diskSh(t, s, sb.ID, "cat /root/kept; stat -c %s /root/big"); res.Stdout != fmt.Sprintf("kept\n%d\n", big) {
			t.Fatalf("resumed: /root/kept and the size of /root/big: %q", res.Stdout)
		}
		if res := diskSh(t, s, sb.ID, "dd if=/dev/zero of=/root/more bs=1M count=1 conv=fsync 2>&1"); res.ExitCode == 0 ||
			!strings.Contains(res.Stdout, "Disk quota exceeded") {
			t.Errorf("a write of a sandbox over its quota: exit %d %q, want EDQUOT", res.ExitCode, res.Stdout)
		} else {
			t.Logf("a write over the quota: %s", strings.TrimSpace(res.Stdout))
		}
		// Freed, it writes again, and pauses and resumes as any other.
		diskSh(t, s, sb.ID, "rm -f /root/big /root/more; sync")
		diskWantWrite(t, "after freeing space", diskSh(t, s, sb.ID, "dd if=/dev/zero of=/root/more bs=1M count=8 conv=fsync 2>&1"))
		sparsePause(t, s, sb.ID)
		got, err = sparseResume(t, s, sb.ID)
		if err != nil || got.Pause == nil || got.Pause.Warning != "" {
			t.Fatalf("resume after freeing space: %+v %v, want running without a warning", got, err)
		}
		if res := diskSh(t, s, sb.ID, "cat /root/kept"); res.Stdout != "kept\n" {
			t.Errorf("resumed: /root/kept %q", res.Stdout)
		}
	})
}

// sparseSwapLayer replaces the layer.tar of the snapshot in dir with a copy that also holds /root/big, n bytes
// of zeros stored in full (as versions before sparse entries stored a sparse file), fixing the manifest's size
// and checksum of it. The returned function puts the original layer and manifest back.
func sparseSwapLayer(t *testing.T, dir string, n int64) func() {
	t.Helper()
	layer, manifest := filepath.Join(dir, "layer.tar"), filepath.Join(dir, "manifest.json")
	save := t.TempDir()
	for _, p := range []string{layer, manifest} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(save, filepath.Base(p)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	in, err := os.Open(filepath.Join(save, "layer.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(layer)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(out, h)}
	tr, tw := tar.NewReader(in), tar.NewWriter(cw)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "root/big", Size: n, Mode: 0o644,
		ModTime: time.Now(), Format: tar.FormatPAX}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(tw, zeroReader{}, n); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	parts, _ := m["parts"].(map[string]any)
	if parts == nil || parts["layer.tar"] == nil {
		t.Fatalf("manifest without parts.layer.tar: %s", b)
	}
	parts["layer.tar"] = map[string]any{"size": cw.n, "sha256": hex.EncodeToString(h.Sum(nil))}
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(manifest, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		for _, p := range []string{layer, manifest} {
			b, err := os.ReadFile(filepath.Join(save, filepath.Base(p)))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
