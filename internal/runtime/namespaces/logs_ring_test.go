package namespaces

import (
	"path/filepath"
	"testing"
)

// Lines tagged host=<hostname> are filed under that sandbox, the rest under the family; each ring keeps its
// last ringLines lines.
func TestLogSinkFilesLinesPerSandbox(t *testing.T) {
	s, err := openLogSink(filepath.Join(t.TempDir(), "sandboxes.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.write("fam_1", []byte("time=x level=WARN msg=one host=sbx-aaaa"), false)
	s.write("fam_1", []byte("time=x level=WARN msg=two host=sbx-bbbb err=x"), false)
	s.write("fam_1", []byte("init: reaped"), false)
	got := s.lines("sbx-aaaa", "fam_1")
	if len(got) != 2 || got[0].Source != "agent" || got[0].Text != "time=x level=WARN msg=one host=sbx-aaaa" ||
		got[1].Source != "family" {
		t.Fatalf("sbx-aaaa: %+v", got)
	}
	if got := s.lines("sbx-bbbb", "fam_2"); len(got) != 1 || got[0].Text[len(got[0].Text)-5:] != "err=x" {
		t.Fatalf("sbx-bbbb in another family: %+v", got)
	}
	for i := 0; i < ringLines+5; i++ {
		s.write("fam_1", []byte("x host=sbx-cccc"), i == ringLines+4)
	}
	got = s.lines("sbx-cccc", "none")
	if len(got) != ringLines || got[len(got)-1].Text != "x host=sbx-cccc [line cut]" {
		t.Fatalf("ring: %d lines, last %+v", len(got), got[len(got)-1])
	}
}
