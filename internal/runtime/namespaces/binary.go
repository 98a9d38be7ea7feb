package namespaces

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// sealedBinary copies the program run as family init and agent (the executable at path, else program, else this
// process's own executable) into a sealed memfd with mode 0111, and returns it. Family inits and agents are exec'd from it, never from a path:
//
//   - a process exec'd from a file it cannot read is non-dumpable from its first instruction, and its memory
//     belongs to the host's user namespace (the kernel's would_dump): nothing in a sandbox, not even root of the
//     family's user namespace, can open its /proc/<pid>/mem, environ, fd or root, ptrace it or take its
//     descriptors. The file is owned by host root, which the family's user namespace does not map, so sandbox
//     root's CAP_DAC_OVERRIDE does not apply to it either;
//   - the sandbox's uid need not reach the server's binary (a checkout under /root works), and replacing the
//     binary on disk does not change what running families execute.
func sealedBinary(path string, program []byte) (*os.File, error) {
	var src io.Reader = bytes.NewReader(program)
	if path != "" || program == nil {
		if path == "" {
			path = "/proc/self/exe"
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("open ramify binary: %w", err)
		}
		defer f.Close()
		src = f
	}
	fd, err := unix.MemfdCreate("ramify", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) { // a kernel before 6.3 has no MFD_EXEC (its memfds are executable)
		fd, err = unix.MemfdCreate("ramify", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd for the ramify binary: %w", err)
	}
	f := os.NewFile(uintptr(fd), "ramify-binary")
	ok := false
	defer func() {
		if !ok {
			f.Close()
		}
	}()
	if _, err := io.Copy(f, src); err != nil {
		return nil, fmt.Errorf("copy ramify binary: %w", err)
	}
	if err := f.Chmod(0o111); err != nil {
		return nil, fmt.Errorf("chmod ramify binary: %w", err)
	}
	if err := seal(f); err != nil {
		return nil, fmt.Errorf("seal ramify binary: %w", err)
	}
	ok = true
	return f, nil
}

// seal seals memfd f against every change. F_SEAL_WRITE fails with EBUSY while something else holds a reference
// to one of its pages (the kernel waits a moment for it to go): seen once on a loaded host, as a server failed to
// start, with page scanners at work (DAMON). It is tried again a few times.
func seal(f *os.File) error {
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	for try := 1; ; try++ {
		_, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals)
		if !errors.Is(err, unix.EBUSY) || try == 5 {
			return err
		}
		time.Sleep(time.Duration(try) * 50 * time.Millisecond)
	}
}

// execPath is the path through which a child of this process executes f.
func execPath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }
