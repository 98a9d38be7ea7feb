package files

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSetAttrChangesModeAndTimeInsideTheRootOnly(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	outside := filepath.Join(dir, "outside")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(outside, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs, err := Open(root, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	if _, err := fs.Write("/f", strings.NewReader("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	mode, when := os.FileMode(0o755), time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := fs.SetAttr("/f", &mode, &when); err != nil {
		t.Fatal(err)
	}
	e, err := fs.Stat("/f")
	if err != nil || e.Mode != "0755" || !e.MTime.Equal(when) {
		t.Fatalf("after SetAttr: %+v, %v", e, err)
	}
	// An absolute symlink to a host file resolves inside the root (where there is no such file).
	if err := os.Symlink(outside, filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := fs.SetAttr("/escape", &mode, nil); err == nil {
		t.Fatal("SetAttr through a symlink out of the root succeeded")
	}
	if st, _ := os.Stat(outside); st.Mode().Perm() != 0o600 {
		t.Fatalf("the host file's mode changed to %v", st.Mode())
	}
	if err := fs.SetAttr("/proc/x", &mode, nil); err == nil {
		t.Fatal("SetAttr under /proc succeeded")
	}
}
