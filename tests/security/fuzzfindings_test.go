package security

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// TestFuzzFindingsMarkerPrefix: sandbox output that contains the interpreter's sync-marker prefix is output like
// any other; it neither swallows what follows nor the interpreter's own marker.
func TestFuzzFindingsMarkerPrefix(t *testing.T) {
	s := testserver.Start(t)
	id := s.Create(t, nil)
	ex := s.Run(t, id, "import os\nos.write(1, b'\\x00ramify-sync:')\nos.system('echo after-marker')")
	if !strings.Contains(ex.Stdout, "after-marker") || strings.Contains(ex.Stdout, "ramify-sync:1") {
		t.Errorf("output after a marker prefix: %q", ex.Stdout)
	}
	if ex = s.Run(t, id, "os.system('echo next-run')"); ex.Stdout != "next-run\n" {
		t.Errorf("next run's output: %q", ex.Stdout)
	}
}

// sparseArchive is a 3 KiB tar whose one entry (GNU PAX 1.0 sparse, a single hole) reads as size zero bytes.
func sparseArchive(size int64) []byte {
	rec := func(k, v string) string {
		line := " " + k + "=" + v + "\n"
		n := len(line) + 1
		for len(strconv.Itoa(n))+len(line) != n {
			n++
		}
		return strconv.Itoa(n) + line
	}
	pax := rec("GNU.sparse.major", "1") + rec("GNU.sparse.minor", "0") + rec("GNU.sparse.name", "big") +
		rec("GNU.sparse.realsize", strconv.FormatInt(size, 10))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "pax", Size: int64(len(pax)), Mode: 0o644, Format: tar.FormatUSTAR})
	tw.Write([]byte(pax))
	m := make([]byte, 512)
	copy(m, "1\n0\n0\n")
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "GNUSparseFile.0/big", Size: 512, Mode: 0o644, Format: tar.FormatUSTAR})
	tw.Write(m)
	tw.Close()
	b := buf.Bytes()
	b[156] = tar.TypeXHeader
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b[:512] {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// TestFuzzFindingsArchiveUpload: a sparse entry is refused (it expanded a 3 KiB upload to 256 MiB on the
// sandbox's disk) and an archive cut inside an entry is a 400, not a 500.
func TestFuzzFindingsArchiveUpload(t *testing.T) {
	s := testserver.Start(t)
	id := s.Create(t, nil)
	_, err := s.Client.UploadArchive(testserver.Ctx(t), id, "/root/x", bytes.NewReader(sparseArchive(256<<20)))
	if !errors.Is(err, client.ErrInvalid) {
		t.Errorf("sparse archive: %v, want a 400", err)
	}
	if v := s.Value(t, id, "import os; os.path.exists('/root/x/big')"); v != "False" {
		t.Errorf("the sparse entry was extracted")
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "f", Size: 1000, Mode: 0o644})
	tw.Write(bytes.Repeat([]byte("a"), 1000))
	tw.Close()
	if _, err := s.Client.UploadArchive(testserver.Ctx(t), id, "/root/y", bytes.NewReader(buf.Bytes()[:700])); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("truncated archive: %v, want a 400", err)
	}
}
