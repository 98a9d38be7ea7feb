package snapstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// directChunk is the unit of a direct write: large enough that the device streams, small enough that the
// chunks in flight cost little memory.
const directChunk = 4 << 20

// Chunks a fillDirect holds (being read, hashed or written), and how many writes it has in flight.
const (
	fillChunks  = 6
	fillWriters = 2
)

// fillDirect copies r into f (empty, at offset 0) and returns the size and CRC-32C. The calling goroutine
// reads chunks; one goroutine checksums them, in order, and others write them (fillWriters at once, each at its
// own offset), so that neither the checksum nor the reads wait for the device. The writes
// bypass the page cache (O_DIRECT) where the file system allows it: on the machines we measured, 1 GiB written
// and fsynced took 0.9 s direct against 2.6 s through the page cache, most of that CPU spent copying into it.
// Only the final, partial chunk is written through the page cache (O_DIRECT needs aligned lengths), once the
// others are written; the caller fsyncs.
func fillDirect(ctx context.Context, f *os.File, r io.Reader) (int64, Sum, error) {
	fd := int(f.Fd())
	flags, direct, err := setDirect(f)
	if err != nil {
		return 0, Sum{}, err
	}
	r = ctxReader{ctx, r}
	free := make(chan []byte, fillChunks)
	for range fillChunks {
		b, err := alignedBuffer(directChunk)
		if err != nil {
			return 0, Sum{}, err
		}
		defer freeBuffer(b) // after every goroutine below is done with it
		free <- b
	}
	// Each chunk read goes to the hasher and to a writer; its buffer is free again once both are done with it.
	type chunk struct {
		b    []byte
		off  int64
		refs *atomic.Int32
	}
	release := func(c chunk) {
		if c.refs.Add(-1) == 0 {
			free <- c.b[:cap(c.b)]
		}
	}
	toHash, toWrite := make(chan chunk, fillChunks), make(chan chunk, fillChunks)
	h := NewCRC32C()
	var wg sync.WaitGroup
	wg.Add(1 + fillWriters)
	go func() {
		defer wg.Done()
		for c := range toHash {
			h.Write(c.b)
			release(c)
		}
	}()
	var failed atomic.Bool
	werrs := make([]error, fillWriters)
	for i := range fillWriters {
		go func() {
			defer wg.Done()
			for c := range toWrite {
				if werrs[i] == nil && !failed.Load() {
					if werrs[i] = pwriteAll(fd, c.b, c.off); werrs[i] != nil {
						failed.Store(true)
					}
				}
				release(c)
			}
		}()
	}
	var n int64
	var rerr error
	var tail []byte // a last chunk of unaligned length, written once the direct writes are done
	for !failed.Load() {
		b := <-free
		k, err := io.ReadFull(r, b[:directChunk])
		if k > 0 {
			c := chunk{b: b[:k], off: n, refs: new(atomic.Int32)}
			n += int64(k)
			if direct && k%4096 != 0 { // the last chunk read: no buffer is taken after it, so hashed it stays
				c.refs.Store(1)
				tail = c.b
				toHash <- c
			} else {
				c.refs.Store(2)
				toHash <- c
				toWrite <- c
			}
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
	}
	close(toHash)
	close(toWrite)
	wg.Wait()
	if err := errors.Join(werrs...); err != nil {
		return n, Sum{}, err
	}
	if rerr != nil {
		return n, Sum{}, rerr
	}
	if tail != nil {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags); err != nil {
			return n, Sum{}, err
		}
		if err := pwriteAll(fd, tail, n-int64(len(tail))); err != nil {
			return n, Sum{}, err
		}
	}
	return n, Sum{}.Of(h), nil
}

// pwriteAll writes b at off.
func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		k, err := unix.Pwrite(fd, b, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		b, off = b[k:], off+int64(k)
	}
	return nil
}

// directReader reads a file through O_DIRECT into aligned buffers of its own, and reads ahead: up to
// directAhead chunks are read from the device at once, while the caller consumes (checksums) the one before. A
// resume streams gigabytes once: going around the page cache saves the copy into it (see fillDirect); reading
// ahead keeps the device busy while the chunk before is checksummed (SHA-256, of older snapshots: ~0.75 s a GiB); and
// several requests in flight read faster than one (1 GiB on the machines we measured: 1.5-1.7 s as 4 MiB reads
// one at a time, 1.0-1.25 s as 8 MiB reads four at a time). The file must not change while it is read (objects
// never do).
type directReader struct {
	f      *os.File
	size   int64
	bufs   [][]byte            // page-aligned, directReadChunk long; unmapped by Close once no read is in flight
	queue  chan chan readChunk // each chunk's result, in file order; closed after the last
	free   chan []byte         // buffers the caller is done with
	stop   chan struct{}       // closed by Close
	wg     sync.WaitGroup      // the dispatcher and the reads it started
	cur    []byte              // the chunk being consumed: cur[r:] is unread
	r      int
	err    error // what follows cur: io.EOF after the last chunk, or the read's error
	closed bool
}

// readChunk is a chunk read: b holds its bytes, err what comes after them (io.EOF after the file's last).
type readChunk struct {
	b   []byte
	err error
}

const (
	// directReadChunk is the size of one direct read.
	directReadChunk = 8 << 20
	// directAhead is how many chunks a directReader holds: the one being consumed and the reads in flight.
	directAhead = 4
)

// openDirect wraps f; if the file system refuses O_DIRECT, f is returned as it is. A file smaller than one
// chunk (a manifest, the layer of a sandbox that changed few files) is read through the page cache too: it
// was written through it (fillDirect writes the last partial chunk so), and a direct read of it waits for the
// device, 3-8 ms on the machines we measured, for a few kilobytes already in memory.
func openDirect(f *os.File) io.ReadCloser {
	fi, err := f.Stat()
	if err != nil || fi.Size() < directChunk {
		return f
	}
	flags, direct, err := setDirect(f)
	if err != nil || !direct {
		return f
	}
	d := &directReader{f: f, size: fi.Size(), queue: make(chan chan readChunk, directAhead),
		free: make(chan []byte, directAhead), stop: make(chan struct{})}
	for range directAhead {
		b, err := alignedBuffer(directReadChunk)
		if err != nil {
			for _, b := range d.bufs {
				freeBuffer(b)
			}
			unix.FcntlInt(f.Fd(), unix.F_SETFL, flags) //nolint:errcheck
			return f
		}
		d.bufs = append(d.bufs, b)
		d.free <- b
	}
	d.wg.Add(1)
	go d.dispatch()
	return d
}

// dispatch starts a read of each chunk of the file, in order, as buffers come free, until the end or Close.
func (d *directReader) dispatch() {
	defer d.wg.Done()
	defer close(d.queue)
	for off := int64(0); off < d.size; off += directReadChunk {
		var b []byte
		select {
		case b = <-d.free:
		case <-d.stop:
			return
		}
		res := make(chan readChunk, 1)
		d.queue <- res // never blocks: the queue holds as many results as there are buffers
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			res <- d.readAt(b, off)
		}()
	}
}

// readAt reads the chunk at off into b (whole: a direct read is short only at the end of the file).
func (d *directReader) readAt(b []byte, off int64) readChunk {
	want := int(min(int64(len(b)), d.size-off))
	for {
		n, err := unix.Pread(int(d.f.Fd()), b, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return readChunk{nil, fmt.Errorf("read %s at %d: %w", d.f.Name(), off, err)}
		}
		if n < want {
			return readChunk{nil, fmt.Errorf("read %s at %d: %d bytes, want %d: %w", d.f.Name(), off, n, want, io.ErrUnexpectedEOF)}
		}
		if off+int64(want) >= d.size {
			return readChunk{b[:want], io.EOF}
		}
		return readChunk{b[:want], nil}
	}
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

// hugePage is the size of a transparent huge page (x86-64, and arm64 with 4 KiB pages).
const hugePage = 2 << 20

// alignedBuffer returns a buffer of n bytes of fresh memory (n a multiple of 2 MiB), page-aligned as O_DIRECT
// requires and aligned to 2 MiB, backed by transparent huge pages where the host gives them (MADV_HUGEPAGE;
// "madvise" or "always" mode): filling a 4 MiB chunk then takes 2 page faults instead of 1,024, which cost ~20 ms
// on a VM whose faults cost ~20 us (a 10 MB session's pause spent ~45 ms on them). freeBuffer frees it.
func alignedBuffer(n int) ([]byte, error) {
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(n+hugePage), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	head := -uintptr(p) & (hugePage - 1) // bytes up to the first 2 MiB boundary
	if head > 0 {
		unix.MunmapPtr(p, head) //nolint:errcheck // only address space
	}
	unix.MunmapPtr(unsafe.Add(p, head+uintptr(n)), hugePage-head) //nolint:errcheck // the rest after it: only address space
	b := unsafe.Slice((*byte)(unsafe.Add(p, head)), n)
	unix.Madvise(b, unix.MADV_HUGEPAGE) //nolint:errcheck // without transparent huge pages: small pages, as before
	return b, nil
}

// freeBuffer frees a buffer from alignedBuffer.
func freeBuffer(b []byte) {
	unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(cap(b))) //nolint:errcheck // nothing to do about it
}

func (d *directReader) Read(p []byte) (int, error) {
	for d.r == len(d.cur) {
		if d.cur != nil {
			d.free <- d.cur[:cap(d.cur)] // never blocks: free holds every buffer
			d.cur, d.r = nil, 0
		}
		if d.err != nil {
			return 0, d.err
		}
		res, ok := <-d.queue
		if !ok {
			return 0, io.EOF
		}
		c := <-res
		d.cur, d.r, d.err = c.b, 0, c.err
	}
	n := copy(p, d.cur[d.r:])
	d.r += n
	return n, nil
}

// Close stops the read-ahead, waits for the reads in flight, then frees the buffers and closes the file.
func (d *directReader) Close() error {
	if d.closed {
		return nil
	}
	d.closed = true
	close(d.stop)
	d.wg.Wait()
	for _, b := range d.bufs {
		freeBuffer(b)
	}
	return d.f.Close()
}
