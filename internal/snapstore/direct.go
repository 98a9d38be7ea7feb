package snapstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// directChunk is the unit of a direct write: large enough that the device streams, small enough that three
// of them in flight cost little memory.
const directChunk = 4 << 20

// fillDirect copies r into f (empty, at offset 0) and returns the size and hex SHA-256. Reading and hashing run
// in the calling goroutine while another writes the previous chunk, and the writes bypass the page cache
// (O_DIRECT) where the file system allows it: on the machines we measured, 1 GiB written and fsynced took 0.9 s
// direct against 2.6 s through the page cache, most of that CPU spent copying into it. Only the final, partial
// chunk is written through the page cache (O_DIRECT needs aligned lengths); the caller fsyncs.
func fillDirect(ctx context.Context, f *os.File, r io.Reader) (int64, string, error) {
	fd := int(f.Fd())
	flags, direct, err := setDirect(f)
	if err != nil {
		return 0, "", err
	}
	r = ctxReader{ctx, r}
	const nbuf = 3
	free := make(chan []byte, nbuf)
	for i := 0; i < nbuf; i++ {
		b, err := alignedChunk()
		if err != nil {
			return 0, "", err
		}
		defer unix.Munmap(b) //nolint:errcheck
		free <- b
	}
	full := make(chan []byte, nbuf)
	werr := make(chan error, 1)
	var failed atomic.Bool
	go func() {
		var err error
		for b := range full {
			if err == nil {
				if direct && len(b)%4096 != 0 {
					direct = false
					if _, ferr := unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags); ferr != nil {
						err = ferr
					}
				}
				if err == nil {
					_, err = f.Write(b)
				}
				if err != nil {
					failed.Store(true)
				}
			}
			free <- b[:cap(b)]
		}
		werr <- err
	}()
	h := sha256.New()
	var n int64
	var rerr error
	for {
		b := <-free
		k, err := io.ReadFull(r, b[:directChunk])
		if k > 0 {
			h.Write(b[:k])
			n += int64(k)
			full <- b[:k]
		} else {
			free <- b
		}
		if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			rerr = err
			break
		}
		if failed.Load() { // the writer failed: stop reading
			break
		}
	}
	close(full)
	if err := <-werr; err != nil {
		return n, "", err
	}
	if rerr != nil {
		return n, "", rerr
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// directReader reads a file through O_DIRECT into an aligned buffer of its own: a resume streams gigabytes
// once, and going around the page cache saves the copy into it (see fillDirect).
type directReader struct {
	f      *os.File
	buf    []byte // page-aligned, directChunk long
	r, w   int    // unread bytes are buf[r:w]
	eof    bool
	closed bool
}

// openDirect wraps f; if the file system refuses O_DIRECT, f is returned as it is. A file smaller than one
// chunk (a manifest, the layer of a sandbox that changed few files) is read through the page cache too: it
// was written through it (fillDirect writes the last partial chunk so), and a direct read of it waits for the
// device, 3-8 ms on the machines we measured, for a few kilobytes already in memory.
func openDirect(f *os.File) io.ReadCloser {
	if fi, err := f.Stat(); err != nil || fi.Size() < directChunk {
		return f
	}
	flags, direct, err := setDirect(f)
	if err != nil || !direct {
		return f
	}
	buf, err := alignedChunk()
	if err != nil {
		unix.FcntlInt(f.Fd(), unix.F_SETFL, flags) //nolint:errcheck
		return f
	}
	return &directReader{f: f, buf: buf}
}

// setDirect turns O_DIRECT on for f and returns its flags from before; direct is false where the file system
// refuses it (tmpfs, say), and f is then unchanged.
func setDirect(f *os.File) (flags int, direct bool, err error) {
	flags, err = unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		return 0, false, err
	}
	_, derr := unix.FcntlInt(f.Fd(), unix.F_SETFL, flags|unix.O_DIRECT)
	return flags, derr == nil, nil
}

// alignedChunk returns a page-aligned buffer of directChunk bytes, as O_DIRECT requires; unix.Munmap frees it.
func alignedChunk() ([]byte, error) {
	return unix.Mmap(-1, 0, directChunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
}

func (d *directReader) Read(p []byte) (int, error) {
	if d.r == d.w {
		if d.eof {
			return 0, io.EOF
		}
		n, err := d.f.Read(d.buf)
		if n < len(d.buf) || err == io.EOF {
			d.eof = true // direct reads return short only at the end of the file
		}
		if err != nil && err != io.EOF {
			return 0, err
		}
		d.r, d.w = 0, n
		if n == 0 {
			return 0, io.EOF
		}
	}
	n := copy(p, d.buf[d.r:d.w])
	d.r += n
	return n, nil
}

func (d *directReader) Close() error {
	if d.closed {
		return nil
	}
	d.closed = true
	unix.Munmap(d.buf) //nolint:errcheck
	return d.f.Close()
}
