package security

import (
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/testserver"
)

// A sandbox that takes every inotify instance it can does not exhaust host root's (the kernel charges them to the
// owner of each user namespace up the tree: a family's is a uid of its own), nor another family's.
func TestInotifyExhaustionStaysInItsFamily(t *testing.T) {
	s := testserver.Start(t)
	hog := s.Create(t, nil)
	got := s.Value(t, hog, `import ctypes
libc = ctypes.CDLL(None, use_errno=True)
held = []
while len(held) < 4096:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    held.append(fd)
len(held)`)
	n, _ := strconv.Atoi(got)
	t.Logf("the sandbox holds %d inotify instances", n)
	if n < 64 {
		t.Fatalf("the hog got only %s instances", got)
	}
	// Host root can still create one.
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Errorf("host root's inotify_init1 fails while a sandbox holds %d instances: %v", n, err)
	} else {
		unix.Close(fd)
	}
	// So can another sandbox.
	other := s.Create(t, nil)
	if out := s.Value(t, other, "import ctypes; ctypes.CDLL(None).inotify_init1(0) >= 0"); out != "True" {
		t.Errorf("another sandbox cannot create an inotify instance: %s", out)
	}
	if !strings.Contains(s.Value(t, hog, "str(len(held))"), got) {
		t.Errorf("the hog lost its instances")
	}
}
