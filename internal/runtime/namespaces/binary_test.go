package namespaces

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSealWaitsOutABusyFile: sealing against writes fails with EBUSY while something holds the memfd's pages
// (here a writable shared mapping, released 120 ms later); seal tries again, and the seals hold once it returns.
func TestSealWaitsOutABusyFile(t *testing.T) {
	fd, err := unix.MemfdCreate("seal-test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "seal-test")
	defer f.Close()
	if _, err := f.Write(make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); err != unix.EBUSY {
		t.Fatalf("sealing a mapped memfd: %v, want EBUSY (the case seal waits out)", err)
	}
	go func() {
		time.Sleep(120 * time.Millisecond)
		unix.Munmap(m) //nolint:errcheck
	}()
	if err := seal(f); err != nil {
		t.Fatalf("seal: %v", err)
	}
	if _, err := f.Write([]byte("x")); err == nil {
		t.Fatal("a write to the sealed memfd succeeded")
	}
}
