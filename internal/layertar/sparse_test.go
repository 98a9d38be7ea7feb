package layertar

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// sparseShape is a sparse file to build: its apparent size and the segments to fill with data.
type sparseShape struct {
	name string
	size int64
	data [][2]int64 // offset, length
}

func sparseShapes() []sparseShape {
	many := sparseShape{name: "many", size: 64 << 20}
	for off := int64(0); off < many.size; off += 64 << 10 {
		many.data = append(many.data, [2]int64{off + 8<<10, 4 << 10})
	}
	return []sparseShape{
		{name: "hole-start", size: 4 << 20, data: [][2]int64{{1 << 20, 4 << 10}}},
		{name: "hole-end", size: 10 << 20, data: [][2]int64{{0, 64 << 10}}},
		{name: "only-hole", size: 256 << 20},
		{name: "odd-end", size: 3<<20 + 123, data: [][2]int64{{64 << 10, 5}, {3 << 20, 123}}},
		{name: "holes-between", size: 8 << 20, data: [][2]int64{{0, 4 << 10}, {2 << 20, 1 << 20}, {8<<20 - 4<<10, 4 << 10}}},
		many,
	}
}

// makeSparse creates the file p of shape s, its data pseudo-random.
func makeSparse(t testing.TB, p string, s sparseShape) {
	t.Helper()
	f, err := os.Create(p)
	must(t, err)
	defer f.Close()
	must(t, f.Truncate(s.size))
	for i, d := range s.data {
		buf := make([]byte, d[1])
		for j := range buf {
			buf[j] = byte(i*31 + j*7 + 1)
		}
		_, err := f.WriteAt(buf, d[0])
		must(t, err)
	}
	must(t, f.Close())
}

func fileHash(t testing.TB, p string) ([32]byte, unix.Stat_t) {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Stat(p, &st))
	f, err := os.Open(p)
	must(t, err)
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	must(t, err)
	return [32]byte(h.Sum(nil)), st
}

// TestSparseRoundTrip: a file with holes is stored as its data only, and extracted byte-identical with its
// holes as holes (no more blocks allocated than the original, but for the file system's own metadata).
func TestSparseRoundTrip(t *testing.T) {
	requireRoot(t)
	for _, s := range sparseShapes() {
		t.Run(s.name, func(t *testing.T) {
			src, dst := t.TempDir(), t.TempDir()
			makeSparse(t, filepath.Join(src, "f"), s)
			must(t, os.Link(filepath.Join(src, "f"), filepath.Join(src, "hardlink")))
			wantSum, wantSt := fileHash(t, filepath.Join(src, "f"))
			if wantSt.Blocks*512 >= s.size {
				t.Skipf("the file system of %s did not keep %s sparse", src, s.name)
			}
			var buf bytes.Buffer
			wst, err := Write(&buf, src, nil, 0)
			must(t, err)
			var data int64
			for _, d := range s.data {
				data += d[1]
			}
			// The data, a record per segment, the headers: never the holes.
			if limit := data + int64(len(s.data)+1)*segmentRecordSize + 16<<10; int64(buf.Len()) > limit {
				t.Errorf("archive is %d bytes for %d bytes of data in a %d byte file, want <= %d", buf.Len(), data, s.size, limit)
			}
			xst, err := Extract(bytes.NewReader(buf.Bytes()), dst)
			must(t, err)
			if wst.Bytes != xst.Bytes || wst.Files != xst.Files {
				t.Errorf("write stats %+v != extract stats %+v", wst, xst)
			}
			for _, name := range []string{"f", "hardlink"} {
				gotSum, gotSt := fileHash(t, filepath.Join(dst, name))
				if gotSt.Size != s.size || gotSum != wantSum {
					t.Errorf("%s: size %d, content equal %v; want size %d, equal content", name, gotSt.Size, gotSum == wantSum, s.size)
				}
				// Beyond the data's blocks, a file system may allocate a few blocks more or less for its map of
				// extents (ext4: 16 KiB more for the 1024 extents of "many", now and then): not a hole written.
				if gotSt.Blocks*512 > wantSt.Blocks*512+64<<10 {
					t.Errorf("%s: %d blocks allocated, the original has %d: holes were written", name, gotSt.Blocks, wantSt.Blocks)
				}
			}
			var st unix.Stat_t
			must(t, unix.Stat(filepath.Join(dst, "hardlink"), &st))
			if st.Nlink != 2 {
				t.Errorf("hard link lost: nlink %d", st.Nlink)
			}
		})
	}
}

// TestExtractOldArchive: an archive written before sparse entries existed (a sparse file stored in full as a
// regular file, testdata/v1-layer.tar, made by the writer of commit f95acc7) still extracts, to the same
// content.
func TestExtractOldArchive(t *testing.T) {
	requireRoot(t)
	f, err := os.Open("testdata/v1-layer.tar")
	must(t, err)
	defer f.Close()
	dst := t.TempDir()
	_, err = Extract(f, dst)
	must(t, err)
	got, err := os.ReadFile(filepath.Join(dst, "dir", "sparse"))
	must(t, err)
	want := make([]byte, 256<<10)
	copy(want[128<<10:], "data in the middle")
	if !bytes.Equal(got, want) {
		t.Errorf("dir/sparse: %d bytes, not the file written", len(got))
	}
	if b, err := os.ReadFile(filepath.Join(dst, "dense")); err != nil || string(b) != "dense file\n" {
		t.Errorf("dense: %q, %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "link")); err != nil || l != "dir/sparse" {
		t.Errorf("link: %q, %v", l, err)
	}
}

// sparseEntry is a typeSparse tar entry of apparent size size with the given raw content.
func sparseEntry(t testing.TB, size string, content []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{Typeflag: typeSparse, Name: "s", Size: int64(len(content)), Mode: 0o644, Format: tar.FormatPAX}
	if size != "" {
		hdr.PAXRecords = map[string]string{sparseSizeRecord: size}
	}
	must(t, tw.WriteHeader(hdr))
	_, err := tw.Write(content)
	must(t, err)
	must(t, tw.Close())
	return buf.Bytes()
}

func segmentRecords(segs ...[2]uint64) []byte {
	var out []byte
	for _, s := range segs {
		out = binary.BigEndian.AppendUint64(out, s[0])
		out = binary.BigEndian.AppendUint64(out, s[1])
		out = append(out, bytes.Repeat([]byte{'x'}, int(min(s[1], 64)))...)
	}
	return out
}

// TestExtractSparseRefusesBadMaps: a crafted sparse entry cannot write out of order, past the file's size, past
// the entry's end, nor make a file larger than what it says; a huge apparent size costs nothing.
func TestExtractSparseRefusesBadMaps(t *testing.T) {
	requireRoot(t)
	for name, tc := range map[string]struct {
		size    string
		content []byte
	}{
		"no size":        {"", segmentRecords([2]uint64{0, 4})},
		"negative size":  {"-1", nil},
		"past the size":  {"10", segmentRecords([2]uint64{8, 4})},
		"overflow":       {strconv.FormatInt(1<<62, 10), segmentRecords([2]uint64{1<<64 - 2, 4})},
		"out of order":   {"1000", segmentRecords([2]uint64{100, 4}, [2]uint64{50, 4})},
		"overlapping":    {"1000", segmentRecords([2]uint64{100, 8}, [2]uint64{104, 4})},
		"empty segment":  {"1000", segmentRecords([2]uint64{100, 0})},
		"past the entry": {"1000", segmentRecords([2]uint64{0, 65})[:16+64]},
		"partial record": {"1000", []byte("short")},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Extract(bytes.NewReader(sparseEntry(t, tc.size, tc.content)), t.TempDir())
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("err = %v, want ErrInvalid", err)
			}
		})
	}
	// Eight TiB of hole are one ftruncate, not 8 TiB of writes.
	dst := t.TempDir()
	_, err := Extract(bytes.NewReader(sparseEntry(t, strconv.FormatInt(1<<43, 10), segmentRecords([2]uint64{1 << 42, 4}))), dst)
	if errors.Is(err, unix.EFBIG) {
		t.Skip("the file system cannot hold an 8 TiB file")
	}
	must(t, err)
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(dst, "s"), &st))
	if st.Size != 1<<43 || st.Blocks > 64 {
		t.Errorf("size %d, %d blocks; want 8 TiB apparent, a block allocated", st.Size, st.Blocks)
	}
}

// TestWriteMaxData: Write refuses a tree whose file data passes maxData, counting a hard-linked file once and a
// sparse file by its data, not its apparent size.
func TestWriteMaxData(t *testing.T) {
	requireRoot(t)
	src := t.TempDir()
	writePseudoRandom(t, filepath.Join(src, "a"), 1<<20, 1)
	must(t, os.Link(filepath.Join(src, "a"), filepath.Join(src, "a2")))
	makeSparse(t, filepath.Join(src, "s"), sparseShape{size: 1 << 30, data: [][2]int64{{1 << 29, 4 << 10}}})
	if _, err := Write(io.Discard, src, nil, 1<<20+4<<10); err != nil {
		t.Fatalf("a tree of 1 MiB + 4 KiB of data, bounded at that: %v", err)
	}
	writePseudoRandom(t, filepath.Join(src, "b"), 1<<20, 2)
	_, err := Write(io.Discard, src, nil, 2<<20)
	if !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("a tree of 2 MiB + 4 KiB of data, bounded at 2 MiB: %v, want EDQUOT", err)
	}
}
